"""pipeline/shards.py: shards take whole batches of a run and cover it once; more shards than batches is refused."""

from __future__ import annotations

import pytest

from pipeline.shards import Shard, check_shards, n_chunks, shard_of


def test_shards_take_whole_batches_and_cover_the_run_once():
    assert n_chunks(10, 4) == 3
    ranges = [Shard(k, 3).outputs(10, 4) for k in range(3)]
    assert ranges == [(0, 4), (4, 8), (8, 10)]
    # uneven: 7 batches over 3 shards
    ranges = [Shard(k, 3).outputs(25, 4) for k in range(3)]
    assert ranges == [(0, 8), (8, 16), (16, 25)]
    assert [Shard(k, 3).chunks(25, 4) for k in range(3)] == [range(0, 2), range(2, 4), range(4, 7)]
    assert Shard(0, 1).outputs(10, 4) == (0, 10)


@pytest.mark.parametrize("shards, message", [(4, "exceeds the 3 batch"), (0, ">= 1"), (True, ">= 1")])
def test_more_shards_than_batches_is_refused(shards, message):
    with pytest.raises(ValueError, match=message):
        check_shards(shards, 10, 4)


@pytest.mark.parametrize("value, message", [({"index": 3, "of": 3}, r"\[0, 3\)"), ({"index": 0}, "index, of"),
                                            ({"index": "0", "of": 3}, "integer")])
def test_a_bad_shard_param_is_one_line(value, message):
    with pytest.raises(ValueError, match=message):
        shard_of(value)
