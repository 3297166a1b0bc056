"""pipeline.distributed: a single process untouched by it, and a group that cannot be joined (the two-process
behaviour: tests/privacy/test_dpsgd_data_parallel.py, tests/training/test_dpdm.py; the launch: tests/test_launch.py)."""

from __future__ import annotations

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
