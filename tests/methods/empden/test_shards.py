"""sampling.shards: a cell's outputs over S jobs and one gather give the samples, transcript claims and eps of one job.

The stage-level tests run ``empden_sample`` once whole and as S = 3 shards joined by ``empden_gather`` on a tiny
cell (10 outputs in batches of 4: shards of 4, 4 and 2 outputs) and compare: the samples bit for bit, the cell's
stated eps to the last bit, the replay of the joined transcript, and all_runs' composed eps of its lines against
the unsharded line's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.io import load_split, read_json
from pipeline.privacy import ledger
from pipeline.privacy.certify import composed_entry, merged_composition, recompute
from pipeline.privacy.replay import ReplayError, Registered, audit
from pipeline.results.all_runs import run_privacy
from pipeline.methods.empden.grid import Cell
from pipeline.methods.empden.sample_stage import empden_gather, empden_sample
from pipeline.stage import PipelineError
from tests.methods.empden.test_sample_stage import ACCOUNTING, files  # noqa: F401 - the module's fixture

N_OUT, BATCH, S = 10, 4, 3
BINDING = {"run": "r", "experiment": "exp"}
CELLS = [Cell("hybrid", seed=0, beta=1.0, p_percent=55, B=10, T=2),
         Cell("per_step", seed=1, beta=1.0, p_percent=55, B=10, T=2),
         Cell("full_batch", seed=0, beta=1.0, sigma_min=0.5),
         Cell("public_only", seed=2)]


def _params(cell: Cell, **extra) -> dict:
    return {"cell": cell.as_dict(), "accounting": ACCOUNTING, "n_out": N_OUT, "device": "cpu", "config_id": "t",
            "batch_size": BATCH, "ledger_binding": BINDING, **extra}


def _inputs(files, cell: Cell) -> dict:  # noqa: F811 - the fixture
    inputs = {"private": files / "private_train.npz", "public_data": files / "public.npz"}
    if cell.method != "full_batch":
        inputs["public"] = files / "public_edm.pt"
    return inputs


def whole(files, tmp_path, cell: Cell) -> dict:  # noqa: F811
    out = {"samples": tmp_path / "whole" / "s.npz", "ledger": tmp_path / "whole" / "l.jsonl"}
    if not cell.private:
        del out["ledger"]
    empden_sample(_inputs(files, cell), out, _params(cell))
    return out


def sharded(files, tmp_path, cell: Cell, shards: int = S) -> dict:  # noqa: F811
    parts = {}
    for k in range(shards):
        out = {"samples": tmp_path / "shards" / f"{k}.npz", "ledger": tmp_path / "shards" / f"{k}.jsonl"}
        if not cell.private:
            del out["ledger"]
        empden_sample(_inputs(files, cell), out, _params(cell, shard={"index": k, "of": shards}))
        parts.update({f"shard_{k}": out["samples"], **({f"ledger_{k}": out["ledger"]} if cell.private else {})})
    joined = {"samples": tmp_path / "joined" / "s.npz", "ledger": tmp_path / "joined" / "l.jsonl"}
    if not cell.private:
        del joined["ledger"]
    empden_gather(parts, joined, {k: v for k, v in _params(cell).items() if k in ("cell", "accounting", "n_out",
                                                                                   "batch_size", "config_id")})
    return {**joined, "parts": parts}


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.method)
def test_one_job_and_three_shards_write_bit_equal_samples_and_state_the_same_eps(files, tmp_path, cell):  # noqa: F811
    one, three = whole(files, tmp_path, cell), sharded(files, tmp_path, cell)
    a, b = load_split(one["samples"]), load_split(three["samples"])
    assert a.images.shape == (N_OUT, 1, 8, 8)
    assert np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
    fa, fb = read_json(one["samples"].with_suffix(".json"))["empden"], read_json(three["samples"].with_suffix(".json"))["empden"]
    assert "shard" not in fb and fb["n_out"] == N_OUT
    # every fact the tables read, the stated eps included, to the last bit
    assert fa == fb


@pytest.mark.parametrize("cell", CELLS[:3], ids=lambda c: c.method)
def test_the_shards_lines_compose_to_exactly_the_unsharded_eps_in_the_replay_and_all_runs(files, tmp_path, cell):  # noqa: F811
    one, three = whole(files, tmp_path, cell), sharded(files, tmp_path, cell)
    (_, line), = ledger.read_ledger(one["ledger"])
    lines = [e for _, e in ledger.read_ledger(three["ledger"])]
    assert [e.seq for e in lines] == [0, 1, 2] and [e.count for e in lines] == [4, 4, 2]
    assert [e.extra["shard"] for e in lines] == [{"index": k, "of": 3, "outputs": list(r)}
                                                 for k, r in enumerate([(0, 4), (4, 8), (8, 10)])]
    assert all(e.run == "r" for e in lines)
    # each shard's claim is replayed on its own, bound to the cell's run, as line `index` of its transcript
    audit({"cell": three["ledger"]}, {"cell": Registered(claims=3, run="r", experiment="exp", stage="empden_sample",
                                                         delta=line.delta, data_sha256=line.data_sha256)})
    with pytest.raises(ReplayError, match="expected 1"):
        audit({"cell": three["ledger"]}, {"cell": Registered(claims=1)})
    # composed, the three lines are the unsharded line's event: the same certified eps, to the last bit
    assert composed_entry(lines).event == line.event
    assert recompute(composed_entry(lines)) == recompute(line)
    assert run_privacy([three["ledger"]])["eps_certified"] == run_privacy([one["ledger"]])["eps_certified"]
    # and each shard alone claims less than the cell
    assert all(e.claimed_epsilon < line.claimed_epsilon for e in lines)


def test_composition_merges_only_releases_of_the_same_mechanism():
    from pipeline.privacy import accountants as acc

    a, b = acc.outputwise_event(0.5, 0.1, 3), acc.outputwise_event(0.5, 0.1, 4)
    other = acc.outputwise_event(0.7, 0.1, 2)
    assert merged_composition([a, b]) == acc.outputwise_event(0.5, 0.1, 7)
    merged = merged_composition([a, other, b])
    assert merged.events == [acc.outputwise_event(0.5, 0.1, 7), other]


def test_a_missing_shard_or_a_shard_of_another_run_is_refused(files, tmp_path):  # noqa: F811
    cell = CELLS[0]
    three = sharded(files, tmp_path, cell)
    parts = dict(three["parts"])
    gather_params = {"cell": cell.as_dict(), "accounting": ACCOUNTING, "n_out": N_OUT, "batch_size": BATCH}
    out = {"samples": tmp_path / "x" / "s.npz", "ledger": tmp_path / "x" / "l.jsonl"}
    two = {k: v for k, v in parts.items() if not k.endswith("_2")}
    with pytest.raises(PipelineError, match="shard 0 of 2"):
        empden_gather(two, out, gather_params)
    swapped = {**parts, "shard_0": parts["shard_1"]}
    with pytest.raises(PipelineError, match="expected shard 0 of 3"):
        empden_gather(swapped, out, gather_params)
    with pytest.raises(PipelineError, match="is a shard of cell 'hybrid/p55_B10_T2_beta1_s0', not 'per_step"):
        empden_gather(parts, out, {**gather_params, "cell": CELLS[1].as_dict()})
    lines = {**parts, "ledger_1": parts["ledger_0"]}
    with pytest.raises(PipelineError, match="shard 1's one line"):
        empden_gather(lines, out, gather_params)
    assert not out["samples"].exists() and not out["ledger"].exists()


def test_a_shards_line_names_its_outputs(files, tmp_path):  # noqa: F811
    three = sharded(files, tmp_path, CELLS[0])
    first = json.loads(three["parts"]["ledger_1"].read_text())
    assert first["seq"] == 1 and first["extra"]["shard"] == {"index": 1, "of": 3, "outputs": [4, 8]}
