"""train_dpdm as two data-parallel gloo processes (``python -m pipeline --nproc 2 train_dpdm``, torchrun), killed
mid-way (every process, SIGKILL) and rerun: it resumes from rank 0's last checkpoint and releases the single
process's model (float summation order) and ledger line, written once by rank 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.io import Split, save_split
from pipeline.privacy import ledger
from pipeline.training.dpdm import train_dpdm

pytestmark = pytest.mark.slow  # starts torchrun and two fresh Python processes per run

TINY_UNET = {"block_out_channels": [8, 16], "attention": [False, True], "norm_num_groups": 4}
PARAMS = {"epsilon": 1.0, "delta": 1e-5, "batch_size": 8, "steps": 12, "lr": 3e-4, "K": 2, "unet": TINY_UNET,
          "micro_batch": 2, "device": "cpu", "seed": 3, "config_id": "test", "checkpoint_every_s": 0.2,
          "ledger_binding": {"run": "r", "experiment": "exp"}, "private": {"N": 40, "n_classes": 3}}


@pytest.fixture(scope="module")
def private_split(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("data") / "private_train.npz"
    save_split(path, Split(rng.integers(0, 256, (40, 1, 8, 8), dtype=np.uint8), np.arange(40) % 3),
               name="private_train", source="test", seed=0)
    return path


def outputs(tmp: Path) -> dict[str, Path]:
    return {"model": tmp / "models" / "dpdm" / "run.pt", "ledger": tmp / "ledger" / "train_dpdm.jsonl",
            "metrics": tmp / "models" / "dpdm" / "run.json"}


def command(data: Path, out: dict[str, Path], log: Path) -> list[str]:
    return [sys.executable, "-m", "pipeline", "--nproc", "2", "train_dpdm", "--in", f"data={data}", "--out",
            *(f"{k}={v}" for k, v in out.items()), "--params", json.dumps(PARAMS), "--log", str(log)]


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


def mechanism(path: Path) -> dict:
    (_, entry), = ledger.read_ledger(path)
    d = json.loads(entry.to_json())
    d.pop("time_utc")
    return d


@pytest.fixture(scope="module")
def one_process(private_split, tmp_path_factory):
    out = outputs(tmp_path_factory.mktemp("one"))
    train_dpdm({"data": private_split}, out, PARAMS)
    return out


def same_model(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.allclose(wa[k], wb[k], rtol=1e-4, atol=1e-6) for k in wa)


def _processes_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def test_two_processes_killed_mid_way_resume_to_the_single_process_model_and_ledger_line(private_split, one_process,
                                                                                        tmp_path):
    out = outputs(tmp_path)
    log = tmp_path / "train.log"
    state = tmp_path / "checkpoints" / "train_dpdm" / "run" / "state.pt"
    proc = subprocess.Popen(command(private_split, out, log), env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not state.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before its first checkpoint"
    # the whole job dies at once (a node failure): torchrun's agent and both ranks, no state saved on the way out
    for pid in _processes_with(str(tmp_path)):
        os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=60)
    saved = torch.load(state, weights_only=False)["step"]
    assert 0 < saved < PARAMS["steps"] and not out["model"].exists()
    res = subprocess.run(command(private_split, out, log), env=env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, (res.stderr[-3000:], log.read_text()[-3000:])
    metrics = json.loads(out["metrics"].read_text())
    assert metrics["resumed_from"] >= saved and metrics["processes"] == 2
    assert json.loads(one_process["metrics"].read_text())["processes"] == 1
    # the single process's model (float summation order) and ledger line, which rank 0 alone wrote
    assert same_model(out["model"], one_process["model"])
    assert mechanism(out["ledger"]) == mechanism(one_process["ledger"])
    assert sorted(p.name for p in out["model"].parent.iterdir()) == ["run.json", "run.pt"]
    # rank 1 logged beside rank 0's log
    assert "process 2 of 2" in (tmp_path / "train.log.rank1").read_text() and "process 1 of 2" in log.read_text()
