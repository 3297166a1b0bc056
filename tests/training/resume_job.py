"""A tiny training run for the kill/resume test: ``python -m tests.training.resume_job STATE OUT [SLEEP]``.

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

from pipeline.training.loop import run_training

TOTAL_STEPS = 150


def train_tiny(state_path: Path | None, sleep_s: float = 0.0, total_steps: int = TOTAL_STEPS) -> nn.Module:
    torch.manual_seed(0)
    np.random.seed(0)
    gen = torch.Generator().manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.2), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(2))
    y = x.sum(1, keepdim=True).sin()

    def step(i: int) -> float:
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
                       run_hash="tiny", ema_decay=0.9, checkpoint_every_s=0.05,
                       generators={"batches": gen}, desc="tiny")
    return res.ema


if __name__ == "__main__":
    state, out = Path(sys.argv[1]), Path(sys.argv[2])
    ema = train_tiny(state, float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
    torch.save(ema.state_dict(), out)
