"""STRAIGHTDP's cost model (pipeline/methods/straightdp/costs.py): on a named GPU a Stage 2 run asks for its counted
work, not the CPU rate."""

from __future__ import annotations

from pipeline.config import load_config
from pipeline.methods.straightdp import costs
from tests.conftest import REPO


def test_straightdp_on_a_named_gpu_asks_for_its_counted_work_not_the_cpu_rate():
    kmnist = load_config(REPO / "config.yaml", REPO / "configs" / "straightdp_kmnist.yaml")
    kmnist["slurm"]["device_rates"] = "estimate"
    cpu = costs.train_runtime_min(kmnist)
    kmnist["slurm"]["device_rates"] = "l40s"
    gpu = costs.train_runtime_min(kmnist)
    # STRAIGHTDP: "a pixel-space MNIST pipeline run completes in under two GPU-hours" (Sec. 4); the CPU rate asked 332 h
    assert gpu < 4 * 60 < 100 * 60 < cpu
    assert costs.pretrain_runtime_min(kmnist) >= 10 and costs.sample_runtime_min(kmnist) >= 5
