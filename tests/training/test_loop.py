"""The resumable loop: a run killed with SIGKILL and restarted ends at the same weights."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from torch import nn

from pipeline.training import loop
from tests.conftest import REPO
from tests.training.resume_job import TOTAL_STEPS, train_tiny


def _isolated(fn):
    """Run ``fn`` without disturbing this process's global RNGs."""
    np_state = np.random.get_state()
    with torch.random.fork_rng():
        try:
            return fn()
        finally:
            np.random.set_state(np_state)


def _job(state, out, sleep):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "tests.training.resume_job", str(state), str(out), str(sleep)],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _step_on_disk(state) -> int:
    try:
        return int(torch.load(state, weights_only=False)["step"])
    except (FileNotFoundError, EOFError, RuntimeError):
        return 0


def test_a_run_killed_after_a_checkpoint_resumes_to_identical_weights(tmp_path):
    reference = _isolated(lambda: train_tiny(None)).state_dict()
    state, out = tmp_path / "ck" / "state.pt", tmp_path / "final.pt"
    job = _job(state, out, sleep=0.02)
    deadline = time.monotonic() + 120
    while _step_on_disk(state) == 0 and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(job.pid, signal.SIGKILL)
    job.wait()
    killed_at = _step_on_disk(state)
    assert 0 < killed_at < TOTAL_STEPS, "the kill must land mid-run, after a checkpoint"
    assert not out.exists()
    assert _job(state, out, sleep=0.0).wait(timeout=120) == 0
    resumed = torch.load(out, weights_only=True)
    assert resumed.keys() == reference.keys()
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)
    assert _step_on_disk(state) == TOTAL_STEPS


def test_resume_restores_every_rng_and_the_loss_history(tmp_path):
    # in-process variant: stop after 40 steps, continue to 150 (no kill, same claim)
    state = tmp_path / "state.pt"
    full = _isolated(lambda: train_tiny(None)).state_dict()
    _isolated(lambda: train_tiny(state, total_steps=40))
    assert _step_on_disk(state) == 40
    resumed = _isolated(lambda: train_tiny(state)).state_dict()
    assert all(torch.equal(resumed[k], full[k]) for k in full)
    assert len(torch.load(state, weights_only=False)["losses"]) == TOTAL_STEPS


def test_state_of_other_params_is_not_resumed(tmp_path):
    model = nn.Linear(2, 1)
    opt = torch.optim.Adam(model.parameters())
    ema = loop.EMA(model, 0.5)
    loop.save_state(tmp_path / "s.pt", model=model, optimizer=opt, ema=ema, step=3, losses=[1.0, 1.0, 1.0],
                    run_hash="a", generators={})
    assert loop.load_state(tmp_path / "s.pt", "a")["step"] == 3
    assert loop.load_state(tmp_path / "s.pt", "b") is None


def test_params_hash_ignores_only_the_checkpoint_interval():
    a = {"lr": 1e-3, "steps": 10, "checkpoint_every_s": 60}
    assert loop.params_hash(a) == loop.params_hash({**a, "checkpoint_every_s": 1})
    assert loop.params_hash(a) != loop.params_hash({**a, "lr": 2e-3})


def test_ema_warm_up_then_decay():
    model = nn.Linear(1, 1, bias=False)
    nn.init.zeros_(model.weight)
    ema = loop.EMA(model, decay=0.99)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema.update(model, step=0)  # beta_0 = 1/10: mostly the new weights
    assert ema.model.weight.item() == pytest.approx(0.9)
    ema.update(model, step=10_000)  # beta = decay
    assert ema.model.weight.item() == pytest.approx(0.9 + 0.1 * 0.01)


def test_checkpoint_dir_follows_the_results_layout(tmp_path):
    p = tmp_path / "results" / "digits" / "models" / "dpdm" / "eps1.pt"
    assert loop.checkpoint_dir_for(p, "train_dpdm") == tmp_path / "results" / "digits" / "checkpoints" / "train_dpdm" / "eps1"
