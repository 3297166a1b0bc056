"""A toy mechanism of the plug-in test (tests/test_method_plugin.py): per-class means of clipped images.

Each record x (flattened, in [0, 1]) is scaled to norm at most ``CLIP``; the release is the per-class sum
divided by the declared private size N (a public constant) plus N(0, (sigma CLIP / N)^2) on every entry.
Under add/remove one record moves one class's sum by at most CLIP in L2, so the released matrix moves by
CLIP / N: one Gaussian of multiplier sigma. The PLD accountant certifies it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from dp_accounting import dp_event

from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger
from pipeline.privacy.rebuild import Expected, param, register

MECHANISM = "toymean_class_means"
#: every record's norm after clipping
CLIP = 1.0
SETTINGS = acc.PLDSettings(value_discretization_interval=1e-4)


@dataclass(frozen=True)
class Plan:
    sigma: float
    N: int
    delta: float

    @property
    def sensitivity(self) -> float:
        return CLIP / self.N

    @property
    def noise_std(self) -> float:
        return self.sigma * self.sensitivity

    def event(self) -> dp_event.DpEvent:
        return dp_event.GaussianDpEvent(self.sigma)

    def epsilon(self) -> float:
        return acc.pld_epsilon(self.event(), self.delta, settings=SETTINGS)


def clip_rows(x: np.ndarray) -> np.ndarray:
    """Every row scaled to norm at most CLIP."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x * np.minimum(1.0, CLIP / np.maximum(norms, 1e-12))


def release(x: np.ndarray, labels: np.ndarray, n_classes: int, plan: Plan, rng: np.random.Generator) -> np.ndarray:
    """Per-class sums of the clipped rows over N, plus the Gaussian noise: ``[n_classes, dim]``."""
    clipped = clip_rows(x)
    sums = np.stack([clipped[labels == c].sum(axis=0) for c in range(n_classes)])
    return sums / plan.N + rng.normal(0.0, plan.noise_std, sums.shape)


def ledger_entry(plan: Plan, *, stage: str, config_id: str, seed: int) -> ledger.LedgerEntry:
    return ledger.LedgerEntry(
        stage=stage, mechanism=MECHANISM, event=ledger.event_to_dict(plan.event()), sensitivity=plan.sensitivity,
        noise_std=plan.noise_std, sampling={"scheme": "none"}, adjacency="add_or_remove_one", count=1, delta=plan.delta,
        claimed_epsilon=plan.epsilon(), accountant={"name": "pld_pessimistic", **acc.describe(SETTINGS)},
        config_id=config_id, seed=seed, extra={"toymean_sigma": plan.sigma, "N": plan.N})


def plan_from_entry(entry: ledger.LedgerEntry) -> Plan:
    return Plan(sigma=param(entry, "extra.toymean_sigma"), N=param(entry, "extra.N", int), delta=entry.delta)


@register(MECHANISM, size="extra.N")
def _toymean(entry: ledger.LedgerEntry) -> Expected:
    plan = plan_from_entry(entry)
    return Expected(plan.event(), {"sensitivity": plan.sensitivity, "noise_std": plan.noise_std,
                                   "noise_multiplier": plan.sigma, "sampling.scheme": "none",
                                   "adjacency": "add_or_remove_one", "count": 1})
