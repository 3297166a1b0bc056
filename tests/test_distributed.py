"""pipeline.distributed: a single process untouched by it, a group that cannot be joined, and two gloo processes
agreeing on rank 0's decision or stopping together (the two-process DP-SGD: tests/privacy/test_dpsgd_data_parallel.py,
tests/training/test_dpdm.py; the launch: tests/test_launch.py)."""

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
    assert distributed.gather_ordered({2: torch.tensor([2.0]), 0: torch.tensor([0.0])}) == [torch.tensor([0.0]),
                                                                                              torch.tensor([2.0])]
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
