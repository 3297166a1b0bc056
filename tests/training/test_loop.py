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


@pytest.mark.slow  # two fresh Python processes (torch imported twice): the slow tier
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


def _signalled_job(state, out):
    """The tiny job with no timed checkpoint (every 1e9 s): a state on disk can only come from the signal."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "tests.training.resume_job", str(state), str(out), "0.02", "1e9"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow  # two fresh Python processes per signal: the slow tier
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_the_state_exits_128_plus_signal_and_a_rerun_resumes_to_identical_weights(tmp_path, sig):
    reference = _isolated(lambda: train_tiny(None)).state_dict()
    state, out = tmp_path / "ck" / "state.pt", tmp_path / "final.pt"
    job = _signalled_job(state, out)
    for line in job.stdout:  # the job announces each step as it starts
        if line.strip() == "step 5":
            break
    job.send_signal(sig)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 128 + sig
    saved = _step_on_disk(state)
    assert 6 <= saved < TOTAL_STEPS, "step 5 was in flight: it must finish and be saved"
    last = err.strip().splitlines()[-1]
    assert f"stopped by {signal.Signals(sig).name} at step {saved}/{TOTAL_STEPS}" in last
    assert str(state) in last and "rerun" in last and "Traceback" not in err
    assert not out.exists()
    assert _job(state, out, sleep=0.0).wait(timeout=120) == 0
    resumed = torch.load(out, weights_only=True)
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)
    assert _step_on_disk(state) == TOTAL_STEPS


def _linear_run(state, total_steps, on_step=lambda i: None):
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(i):
        on_step(i)
        loss = model(torch.ones(1, 2)).pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    return loop.run_training(model=model, optimizer=opt, step_fn=step, total_steps=total_steps, state_path=state,
                             run_hash="lin", ema_decay=0.5, checkpoint_every_s=1e9)


def test_the_loop_restores_the_callers_signal_handlers_and_repeated_signals_do_not_abort_the_save(tmp_path):
    received = []

    def callers(signum, frame):
        received.append(signum)

    before = {s: signal.signal(s, callers) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        _linear_run(tmp_path / "done.pt", 3)
        assert signal.getsignal(signal.SIGINT) is callers and signal.getsignal(signal.SIGTERM) is callers

        def interrupt(i):  # what Ctrl-C under Snakemake delivers: the terminal's SIGINT, then SIGTERM
            if i == 2:
                signal.raise_signal(signal.SIGINT)
                signal.raise_signal(signal.SIGTERM)

        with pytest.raises(loop.TrainingInterrupted) as info:
            _linear_run(tmp_path / "cut.pt", 10, interrupt)
        assert received == [], "the loop, not the caller, must handle signals while it trains"
        assert signal.getsignal(signal.SIGINT) is callers and signal.getsignal(signal.SIGTERM) is callers
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    assert info.value.exit_code == 130 and info.value.step == 3
    assert _step_on_disk(tmp_path / "cut.pt") == 3
    assert str(info.value).count("\n") == 0 and str(tmp_path / "cut.pt") in str(info.value)


@pytest.mark.parametrize("log", [False, True], ids=["console", "--log"])
def test_the_command_line_reports_an_interrupted_stage_in_one_line_with_128_plus_signal(tmp_path, monkeypatch,
                                                                                        capfd, log):
    from pipeline import cli
    from pipeline.stage import stage

    state = tmp_path / "checkpoints" / "state.pt"

    @stage("tiny", params={})
    def tiny(inputs, outputs, params):
        raise loop.TrainingInterrupted(signal.SIGTERM, 7, 10, state, "tiny")

    monkeypatch.setattr(cli, "load_stage", lambda name: tiny)
    code = cli.main(["tiny", *(["--log", str(tmp_path / "tiny.log")] if log else [])])
    out, err = capfd.readouterr()
    assert code == 143
    line, = err.splitlines()  # one line on the console, no traceback
    assert line.startswith("interrupted: ") and str(state) in line and "step 7/10" in line and "rerun" in line


def test_a_resumed_run_reports_the_per_step_history_of_an_uninterrupted_one(tmp_path):
    # a step function's own per-step records (STRAIGHTDP's gradient-norm quantiles) survive a resume whole
    def run(total_steps, state_path, history):
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(i: int) -> float:
            loss = model(torch.ones(1, 3)).pow(2).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            history.append({"step": i, "w": float(model.weight.sum())})
            return float("nan")

        return loop.run_training(model=model, optimizer=optimizer, step_fn=step, total_steps=total_steps,
                                 state_path=state_path, run_hash="h", ema_decay=0.9, history=history)

    whole: list = []
    _isolated(lambda: run(10, None, whole))
    state = tmp_path / "state.pt"
    _isolated(lambda: run(4, state, []))
    resumed: list = []
    res = _isolated(lambda: run(10, state, resumed))
    assert res.resumed_from == 4 and resumed == whole and len(whole) == 10
