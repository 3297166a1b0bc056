"""A small resumable training loop: Adam, an EMA of the weights, wall-clock checkpoints.

Every training stage (public EDM pretraining, DPDM's DP-SGD) runs its steps through
:func:`run_training`. The loop owns what must survive a kill for the run to continue as if
nothing happened:

* the model and optimizer state (Adam moments and step counts),
* the EMA of the weights (Karras et al. 2022 and DPDM App. C sample from the EMA),
* the step counter and the per-step loss history,
* every random number generator the steps draw from: torch's and numpy's global state
  (dropout, anything a library draws) and the named ``torch.Generator`` objects the caller
  passes (batch sampling, diffusion noise, the DP mechanism's noise).

It is written atomically (temporary file + rename, :func:`pipeline.io.atomic_path`) to
``state.pt`` every ``checkpoint_every_s`` seconds of wall clock and at the end, so a kill at
any instant leaves either the previous or the next complete state. On start, a state file
whose ``params_hash`` matches the run's is loaded and training continues from its step;
because the RNG states are restored too, a resumed run reaches bit-identical weights on the
CPU (``tests/training/test_loop.py`` kills a run with SIGKILL to check this). A state file of
different params is not resumed (it is overwritten at the next checkpoint).

SIGINT (Ctrl-C, which also reaches the jobs Snakemake runs locally) and SIGTERM (what SLURM
sends at the time limit or on ``scancel``, before SIGKILL) lose no work: the loop finishes
the step in flight (a half-applied optimizer step is not a state to resume from), writes the
state, restores the previous handlers and raises :class:`TrainingInterrupted`, which the
command line reports in one line with exit status 128 + signal (130, 143). Only SIGKILL
loses the steps since the last timed checkpoint.

Data-parallel runs (:mod:`pipeline.distributed`): every rank runs the loop; only rank 0 writes the state
(the ranks hold the same weights, optimizer state and streams) and every rank loads it on a resume; a stop
signal seen by any rank stops all of them after the same step (one all-reduce of the flag per step), so no
rank waits forever in the next step's collective.

State files live under ``results/<experiment>/checkpoints/<stage>/<run>/`` and are never a
declared Snakemake output, so a killed job's state survives Snakemake's clean-up of
incomplete outputs (it deletes the outputs of a job it reruns, never this folder) and the
rerun resumes from it.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from pipeline import distributed
from pipeline.io import atomic_path

log = logging.getLogger(__name__)

STATE_FORMAT = "dpgen-train-state/1"
STATE_FILE = "state.pt"


def params_hash(params: Mapping[str, Any], *, ignore: tuple[str, ...] = ("checkpoint_every_s",)) -> str:
    """sha256 of the canonical JSON of ``params`` without the keys that do not change the result."""
    kept = {k: v for k, v in params.items() if k not in ignore}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


def checkpoint_dir_for(model_path: Path, stage: str) -> Path:
    """``results/<exp>/checkpoints/<stage>/<run>/`` for a model written under ``results/<exp>/models/``.

    ``<run>`` is the model file's name without suffix; ``<exp>`` is the folder holding the
    nearest ancestor named ``models`` (else the model file's own folder).
    """
    model_path = Path(model_path)
    exp = next((p.parent for p in model_path.parents if p.name == "models"), model_path.parent)
    return exp / "checkpoints" / stage / model_path.stem


class EMA:
    """Exponential moving average of a model's parameters (buffers are copied).

    theta_ema <- beta_t theta_ema + (1 - beta_t) theta with beta_t = min(decay, (1 + t)/(10 + t)):
    the usual warm-up (as in TensorFlow's ``ExponentialMovingAverage(num_updates=t)``) so that a
    short run's average is not dominated by the random initialisation.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0 <= decay < 1:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        self.decay = float(decay)
        self.model = copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        beta = min(self.decay, (1 + step) / (10 + step))
        for e, p in zip(self.model.parameters(), model.parameters()):
            e.lerp_(p.detach(), 1 - beta)
        for e, b in zip(self.model.buffers(), model.buffers()):
            e.copy_(b)


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on SIGINT/SIGTERM after saving its resumable state.

    A ``KeyboardInterrupt`` so that no ``except Exception`` on the way out swallows it; the
    message is one line saying where the state is and that a rerun resumes from it.
    """

    def __init__(self, signum: int, step: int, total_steps: int, state_path: Path | None, desc: str) -> None:
        self.signum, self.step, self.total_steps, self.state_path = signum, step, total_steps, state_path
        #: the shell's convention for death by a signal: 130 for SIGINT, 143 for SIGTERM
        self.exit_code = 128 + signum
        where = (f"state saved to {state_path}; rerun the same command to resume from step {step}"
                 if state_path is not None else "checkpointing is disabled, nothing was saved")
        super().__init__(f"{desc}: stopped by {signal.Signals(signum).name} at step {step}/{total_steps}; {where}")


class _StopRequest:
    """Turns SIGINT/SIGTERM into a flag the loop polls between steps.

    Repeated signals change nothing: one stop request can reach a job twice (the terminal's
    SIGINT goes to the whole foreground process group, a scheduler may add SIGTERM, SLURM
    signals every step of a job), and the second must not abort the save the first asked for.
    SIGKILL remains the way to stop without saving.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, desc: str) -> None:
        self.desc = desc
        self.signum: int | None = None

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum = signum
            log.warning("%s: %s received; finishing the current step, then saving the state",
                        self.desc, signal.Signals(signum).name)

    @contextlib.contextmanager
    def installed(self) -> Iterator[_StopRequest]:
        """Handle the signals while the block runs; the previous handlers come back afterwards."""
        if threading.current_thread() is not threading.main_thread():
            yield self  # Python delivers signals to the main thread only: nothing to install
            return
        previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


@dataclass
class TrainResult:
    """What :func:`run_training` hands back: the trained model, its EMA and the loss history."""

    model: nn.Module
    ema: nn.Module
    losses: list[float]
    steps: int
    resumed_from: int = 0
    wall_s: float = 0.0
    checkpoints_written: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _numpy_state() -> dict[str, Any]:
    """numpy's global MT19937 state as tensors and numbers, so the file loads with ``weights_only=True``."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def _set_numpy_state(state: Mapping[str, Any]) -> None:
    np.random.set_state((state["name"], state["keys"].numpy().astype(np.uint32), state["pos"],
                         state["has_gauss"], state["cached_gaussian"]))


def _rng_state(generators: Mapping[str, torch.Generator]) -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": _numpy_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "generators": {k: g.get_state() for k, g in generators.items()}}


def _set_rng_state(state: Mapping[str, Any], generators: Mapping[str, torch.Generator]) -> None:
    torch.set_rng_state(state["torch"])
    _set_numpy_state(state["numpy"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for k, g in generators.items():
        g.set_state(state["generators"][k])


def save_state(path: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer, ema: EMA, step: int,
               losses: list[float], run_hash: str, generators: Mapping[str, torch.Generator],
               extra: Mapping[str, Any] | None = None) -> None:
    """Write the complete resumable state atomically."""
    blob = {"format": STATE_FORMAT, "params_hash": run_hash, "step": step, "losses": list(losses),
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "ema": ema.model.state_dict(),
            "rng": _rng_state(generators), "extra": dict(extra or {})}
    with atomic_path(path, suffix=".pt") as tmp:
        torch.save(blob, tmp)


def load_state(path: Path, run_hash: str) -> dict[str, Any] | None:
    """The state at ``path`` if it belongs to this run (same params hash), else ``None``."""
    if not path.is_file():
        return None
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated file cannot happen (atomic rename) but a foreign one can
        log.warning("%s: unreadable training state (%s); starting afresh", path, exc)
        return None
    if not isinstance(blob, dict) or blob.get("format") != STATE_FORMAT:
        log.warning("%s: not a %s file; starting afresh", path, STATE_FORMAT)
        return None
    if blob["params_hash"] != run_hash:
        log.warning("%s: state of different params (hash %s..., this run %s...); starting afresh",
                    path, blob["params_hash"][:12], run_hash[:12])
        return None
    return blob


def run_training(*, model: nn.Module, optimizer: torch.optim.Optimizer, step_fn: Callable[[int], float],
                 total_steps: int, state_path: Path | None, run_hash: str, ema_decay: float,
                 checkpoint_every_s: float = 300.0, generators: Mapping[str, torch.Generator] | None = None,
                 desc: str = "train", show_loss: bool = True, history: list[Any] | None = None) -> TrainResult:
    """Run ``step_fn(step)`` for steps ``0 .. total_steps - 1``, resuming from ``state_path`` if possible.

    ``step_fn`` does one optimisation step (forward, backward, ``optimizer.step()``) and
    returns its loss; it must draw randomness only from the global torch/numpy RNGs or from
    ``generators``, whose states are checkpointed. The EMA is updated after every step.
    ``state_path=None`` disables checkpointing (tests, throw-away runs). ``show_loss=False`` keeps
    the loss off the progress bar (a private run's loss is an unaccounted function of its data).
    SIGINT/SIGTERM during the loop end the step in flight, save the state and raise
    :class:`TrainingInterrupted` (see the module docstring). ``history``, when given, is a list ``step_fn``
    appends its per-step records to (e.g. gradient-norm quantiles): it is saved with the state and
    restored on resume, so a resumed run reports the records of every step, as an uninterrupted one does.
    """
    if not (isinstance(total_steps, int) and total_steps >= 0):
        raise ValueError(f"total_steps must be an integer >= 0, got {total_steps!r}")
    if not checkpoint_every_s > 0:
        raise ValueError(f"checkpoint_every_s must be > 0, got {checkpoint_every_s}")
    generators = dict(generators or {})
    ema = EMA(model, ema_decay)
    step, losses, resumed_from = 0, [], 0
    state = load_state(Path(state_path), run_hash) if state_path is not None else None
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        ema.model.load_state_dict(state["ema"])
        _set_rng_state(state["rng"], generators)
        step = resumed_from = int(state["step"])
        losses = list(state["losses"])
        if history is not None:
            history[:] = list((state.get("extra") or {}).get("history", []))
        log.info("%s: resumed from %s at step %d/%d", desc, state_path, step, total_steps)

    written = 0
    main = distributed.is_main()

    def checkpoint() -> None:
        nonlocal written
        if state_path is not None and main:
            save_state(Path(state_path), model=model, optimizer=optimizer, ema=ema, step=step, losses=losses,
                       run_hash=run_hash, generators=generators,
                       extra=None if history is None else {"history": list(history)})
            written += 1

    start = last = time.monotonic()
    model.train()
    bar = tqdm(total=total_steps, initial=step, desc=desc, unit="step", mininterval=1.0, disable=not main)
    with _StopRequest(desc).installed() as stop:
        while step < total_steps and not distributed.any_rank(stop.signum is not None):
            loss = float(step_fn(step))
            ema.update(model, step)
            losses.append(loss)
            step += 1
            bar.update(1)
            if show_loss and step % 10 == 0:
                bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
            if time.monotonic() - last >= checkpoint_every_s and step < total_steps and stop.signum is None:
                checkpoint()
                last = time.monotonic()
        bar.close()
        # still under the handlers: a second signal must not cut this write short
        checkpoint()
    if stop.signum is not None or step < total_steps:  # stopped: by a signal here, or by another rank's
        raise TrainingInterrupted(stop.signum or signal.SIGTERM, step, total_steps,
                                  None if state_path is None else Path(state_path), desc)
    return TrainResult(model=model, ema=ema.model, losses=losses, steps=step, resumed_from=resumed_from,
                       wall_s=time.monotonic() - start, checkpoints_written=written)
