"""A tiny training run for the kill/resume tests.

``python -m tests.training.resume_job STATE OUT [SLEEP [CHECKPOINT_EVERY_S]]`` prints ``step I``
on stdout as each step starts (so a test can signal it mid-run) and, when the loop stops on a
signal, the loop's one-line message on stderr with exit status 128 + signal.

Draws from every RNG the loop checkpoints (a named generator for batches, torch's global RNG
through dropout, numpy's global RNG for a per-step learning-rate jitter), so a resume that
failed to restore any of them would end at different weights.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pipeline.training.loop import TrainingInterrupted, run_training

TOTAL_STEPS = 150


def train_tiny(state_path: Path | None, sleep_s: float = 0.0, total_steps: int = TOTAL_STEPS,
               checkpoint_every_s: float = 0.05, progress: bool = False) -> nn.Module:
    torch.manual_seed(0)
    np.random.seed(0)
    gen = torch.Generator().manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.2), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(2))
    y = x.sum(1, keepdim=True).sin()

    def step(i: int) -> float:
        if progress:
            print(f"step {i}", flush=True)
        idx = torch.randint(0, 64, (8,), generator=gen)
        for g in opt.param_groups:
            g["lr"] = 1e-2 * (1 + 0.1 * np.random.randn())
        loss = (model(x[idx]) - y[idx]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(sleep_s)
        return loss.item()

    res = run_training(model=model, optimizer=opt, step_fn=step, total_steps=total_steps, state_path=state_path,
                       run_hash="tiny", ema_decay=0.9, checkpoint_every_s=checkpoint_every_s,
                       generators={"batches": gen}, desc="tiny")
    return res.ema


if __name__ == "__main__":
    state, out = Path(sys.argv[1]), Path(sys.argv[2])
    sleep = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    every = float(sys.argv[4]) if len(sys.argv) > 4 else 0.05
    try:
        ema = train_tiny(state, sleep, checkpoint_every_s=every, progress=True)
    except TrainingInterrupted as exc:  # what pipeline.cli does for a stage
        print(exc, file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    torch.save(ema.state_dict(), out)
