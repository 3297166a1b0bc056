"""pipeline.launch: the torchrun command a --nproc launch becomes and where each rank logs, without torch (the CLI
imports it for every stage)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline import launch
from pipeline.stage import PipelineError


def test_a_launch_is_torchrun_of_the_same_interpreter_on_this_node():
    argv = launch.launch_argv(4, ["train_dpdm", "--in", "data=x.npz"])
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in argv and "--nproc-per-node=4" in argv
    assert argv[-5:] == ["-m", "pipeline", "train_dpdm", "--in", "data=x.npz"]
    with pytest.raises(PipelineError, match="--nproc: expected an integer >= 1"):
        launch.launch_argv(0, ["train_dpdm"])


def test_rank_0_logs_to_the_rules_log_and_the_others_beside_it(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert launch.rank_log_path("logs/train.log") == "logs/train.log"
    monkeypatch.setenv("RANK", "3")
    assert launch.rank_log_path("logs/train.log") == "logs/train.log.rank3"


def test_outside_torchrun_the_world_is_one_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert launch.launched_size() == 1
    monkeypatch.setenv("WORLD_SIZE", "x")
    with pytest.raises(PipelineError, match="WORLD_SIZE='x'"):
        launch.launched_size()


def test_the_cli_starts_without_torch(repo):
    # a table, figure or report job never needs torch: its ~4 s import would be paid by every such job
    code = "import sys, pipeline.cli; print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"
