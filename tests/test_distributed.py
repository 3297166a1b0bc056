"""pipeline.distributed: a single process untouched by it, a group that cannot be joined, and two gloo processes
agreeing on rank 0's decision or stopping together, and gathering uneven rows back into one process's order (the
two-process DP-SGD: tests/privacy/test_dpsgd_data_parallel.py, tests/training/test_dp_denoiser.py; the launch:
tests/test_launch.py)."""

from __future__ import annotations

import re

import pytest
import torch

from pipeline import distributed
from pipeline.stage import PipelineError


def test_outside_torchrun_a_stage_is_one_process_on_its_device(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with distributed.data_parallel("cpu") as (world, device):
        assert world == distributed.World(0, 1) and world.main and device == torch.device("cpu")
    monkeypatch.setenv("WORLD_SIZE", "x")
    with pytest.raises(PipelineError, match="WORLD_SIZE='x'"):
        with distributed.data_parallel("cpu"):
            pass


def test_more_processes_than_gpus_is_one_line_before_any_group_is_joined(monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("WORLD_SIZE", str(torch.cuda.device_count() + 1))
    monkeypatch.setenv("LOCAL_RANK", str(torch.cuda.device_count()))
    with pytest.raises(PipelineError, match="data-parallel processes but only"):
        with distributed.data_parallel("cuda:0"):
            pass


def test_the_single_process_collectives_are_identities():
    assert distributed.current() == distributed.World(0, 1) and distributed.is_main()
    t = [torch.ones(3)]
    distributed.all_reduce_sum(t)
    assert torch.equal(t[0], torch.ones(3))
    rows = {2: torch.tensor([[2.0, 20.0]]), 0: torch.tensor([[0.0, 0.0], [1.0, 10.0]])}
    assert torch.equal(distributed.gather_ordered(rows, n_parts=3, width=2, dtype=torch.float32),
                       torch.tensor([[0.0, 0.0], [1.0, 10.0], [2.0, 20.0]]))
    assert distributed.gather_ordered({}, n_parts=0, width=2, dtype=torch.float64).shape == (0, 2)
    with pytest.raises(PipelineError, match=r"^gather_ordered: index 3: rows of shape \(1, 2\)"):
        distributed.gather_ordered({3: torch.zeros(1, 2)}, n_parts=3, width=2, dtype=torch.float32)
    assert distributed.any_rank(True) and not distributed.any_rank(False)


def test_in_one_process_agreeing_with_rank_0_returns_the_decision_itself():
    decision = {"beta": 1.0, "clips": (0.5, 0.25), "steps": 3}
    assert distributed.agree_with_rank0(decision, what="plan") is decision
    # a decision several processes could not compare is refused here too, in one line naming the field
    with pytest.raises(PipelineError, match=r"^plan: field noise_std = nan is not a finite JSON value"):
        distributed.agree_with_rank0({"noise_std": float("nan")}, what="plan")


#: rank 0's decision in every case of the two-process test; rank 1's own is this with CASES[case] merged in
RANK0 = {"tau": 0.25, "beta": 1.0, "clips": (0.5, 0.25), "noise_std": 0.3, "steps": 3}
CASES = {
    "equal": {"clips": [0.5, 0.25]},  # the same JSON: only the container type differs
    "another beta": {"beta": 2.0, "clips": (0.7, 0.1)},
    "the last bit of a float": {"noise_std": 0.1 + 0.2},
    "an int for a float": {"tau": 0},
    "a field rank 0 lacks": {"extra": 1},
    "NaN": {"noise_std": float("nan")},
}


def _agree_rank(rank: int, size: int, init_file: str, out_dir: str) -> None:
    import datetime
    import json
    import os

    import torch.distributed as dist

    # a collective that waits for a rank that stopped fails after 60 s instead of hanging the test
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    results = {}
    try:
        for case, change in CASES.items():
            mine = {**RANK0, **change} if rank == 1 else dict(RANK0)
            try:
                agreed = distributed.agree_with_rank0(mine, what="stage s run: the plan")
                results[case] = {"returned": repr(agreed), "is_mine": agreed is mine}
            except PipelineError as exc:
                results[case] = {"error": str(exc)}
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


@pytest.fixture(scope="module")
def agreement_of_two_processes(tmp_path_factory) -> list[dict[str, dict]]:
    import json

    import torch.multiprocessing as mp

    tmp = tmp_path_factory.mktemp("agree")
    mp.start_processes(_agree_rank, args=(2, str(tmp / "init"), str(tmp)), nprocs=2, start_method="spawn")
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_two_ranks_that_agree_both_get_rank_0s_decision(agreement_of_two_processes):
    rank0, rank1 = agreement_of_two_processes
    assert rank0["equal"] == {"returned": repr(RANK0), "is_mine": True}
    # rank 1 passed clips as a list: what it gets back is rank 0's object, the tuple
    assert rank1["equal"] == {"returned": repr(RANK0), "is_mine": False}


@pytest.mark.parametrize("case, message", [
    ("another beta", r"rank 1's beta = 2\.0 differs from rank 0's beta = 1\.0 \(also differ: clips\)"),
    ("the last bit of a float", r"rank 1's noise_std = 0\.30000000000000004 differs from rank 0's noise_std = 0\.3;"),
    ("an int for a float", r"rank 1's tau = 0 differs from rank 0's tau = 0\.25;"),
    ("a field rank 0 lacks", r"rank 1's extra = 1 differs from rank 0's extra = \(missing\);"),
])
def test_a_rank_that_chose_otherwise_stops_every_rank_in_one_line(agreement_of_two_processes, case, message):
    rank0, rank1 = agreement_of_two_processes
    error = rank1[case].get("error", "")
    assert error == rank0[case].get("error"), "both ranks raise, the same line"
    assert "\n" not in error
    assert re.match(r"^stage s run: the plan: " + message, error), error
    assert error.endswith("every data-parallel rank must use rank 0's, so every rank stops here")


def test_a_decision_one_rank_cannot_compare_stops_every_rank(agreement_of_two_processes):
    rank0, rank1 = agreement_of_two_processes
    assert rank0["NaN"] == rank1["NaN"]
    assert re.match(r"^rank 1's stage s run: the plan: field noise_std = nan is not a finite JSON value \(",
                    rank0["NaN"]["error"])


def _rows(index: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Part ``index``'s ``n`` rows, each naming itself: (index, position, -(10 index + position))."""
    i = torch.arange(n, dtype=dtype)
    return torch.stack([torch.full_like(i, index), i, -(10 * index + i)], 1)


#: per case: (n_parts, dtype, rank 0's parts {index: rows}, rank 1's); parts are micro-batches j on rank j mod 2
#: except where a case says otherwise
GATHER_CASES = {
    "uneven, an empty part": (3, torch.float32, {0: 3, 2: 1}, {1: 0}),
    "rank 1 holds nothing": (1, torch.float64, {0: 2}, {}),
    "rank 0 holds nothing": (2, torch.float32, {}, {0: 1, 1: 4}),
    "both hold several": (5, torch.float32, {0: 4, 2: 4, 4: 1}, {1: 4, 3: 4}),
    "an index no rank holds": (4, torch.float32, {0: 2}, {3: 1}),
    "an empty batch": (0, torch.float32, {}, {}),
    "an index on both ranks": (2, torch.float32, {0: 1, 1: 1}, {1: 2}),
    "a malformed part on rank 1": (2, torch.float32, {0: 1}, {1: -1}),  # -1: rows of the wrong width
}


def _gather_rank(rank: int, size: int, init_file: str, out_dir: str) -> None:
    import datetime
    import os

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    calls = []
    for name in ("all_gather", "all_gather_object"):  # count what the gather uses (delegating: no rank is stranded)
        original = getattr(dist, name)
        setattr(dist, name, lambda *a, _name=name, _f=original, **k: (calls.append(_name), _f(*a, **k))[1])
    results = {}
    try:
        for case, (n_parts, dtype, *per_rank) in GATHER_CASES.items():
            parts = {j: _rows(j, n, dtype) if n >= 0 else torch.zeros(1, 2, dtype=dtype)
                     for j, n in per_rank[rank].items()}
            try:
                results[case] = distributed.gather_ordered(parts, n_parts=n_parts, width=3, dtype=dtype)
            except PipelineError as exc:
                results[case] = str(exc)
    finally:
        dist.destroy_process_group()
    torch.save({"results": results, "calls": calls}, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.fixture(scope="module")
def gather_of_two_processes(tmp_path_factory) -> list[dict]:
    import torch.multiprocessing as mp

    tmp = tmp_path_factory.mktemp("gather")
    mp.start_processes(_gather_rank, args=(2, str(tmp / "init"), str(tmp)), nprocs=2, start_method="spawn")
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.mark.parametrize("case", [c for c in GATHER_CASES if "both ranks" not in c and "malformed" not in c])
def test_two_ranks_gather_uneven_rows_into_the_single_process_order(gather_of_two_processes, case):
    n_parts, dtype, *per_rank = GATHER_CASES[case]
    held = {j: n for mine in per_rank for j, n in mine.items()}
    # what one process holding every part gets: part j's rows, in order of j, then of their position
    expected = distributed.gather_ordered({j: _rows(j, n, dtype) for j, n in held.items()}, n_parts=n_parts,
                                          width=3, dtype=dtype)
    assert expected.shape == (sum(held.values()), 3)
    for rank in (0, 1):
        got = gather_of_two_processes[rank]["results"][case]
        assert got.dtype == dtype and torch.equal(got, expected), (rank, got)


@pytest.mark.parametrize("case, message", [
    ("an index on both ranks", r"^gather_ordered: index 1 is held by ranks \[0, 1\]$"),
    ("a malformed part on rank 1", r"^gather_ordered: rank 1's parts are not indices in range\(2\) with \[n, 3\] "
                                   r"rows of torch.float32"),
])
def test_parts_the_ranks_cannot_gather_stop_every_rank_in_one_line(gather_of_two_processes, case, message):
    for rank in (0, 1):
        error = gather_of_two_processes[rank]["results"][case]
        assert isinstance(error, str) and "\n" not in error and re.match(message, error), (rank, error)
    # the rank whose parts were wrong also says what was wrong
    assert "index 1: rows of shape (1, 2)" in gather_of_two_processes[1]["results"]["a malformed part on rank 1"]


def test_the_gather_is_tensor_collectives_not_pickled_objects(gather_of_two_processes):
    """Two all_gathers per call (the counts, then the padded rows), one where no rank has a row or the counts
    already show an error, and never an all_gather_object."""
    cases = list(GATHER_CASES)
    no_rows = sum(1 for c in cases if c in ("an empty batch", "an index on both ranks", "a malformed part on rank 1"))
    for rank in (0, 1):
        calls = gather_of_two_processes[rank]["calls"]
        assert "all_gather_object" not in calls
        assert calls.count("all_gather") == 2 * len(cases) - no_rows
