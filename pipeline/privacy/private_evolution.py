"""Private Evolution's one private access per iteration (Lin et al. 2024, Alg. 1-2): the noisy
nearest-neighbour histogram.

Each private record votes once for its nearest synthetic candidate (in a public embedding, among
the candidates of its own class when class-conditional); the vote counts are released by the
Gaussian mechanism and thresholded (DP_NN_HISTOGRAM, Alg. 2)::

    H = counts + N(0, sigma^2 I);   H <- max(H - threshold, 0)

Sensitivity: under ADD-OR-REMOVE-ONE adjacency a record adds or removes exactly one vote, so one
bin of the histogram (the concatenation of all classes' histograms: a record has one label)
moves by 1: L2 sensitivity 1 (Lin et al. Sec. 4.2; replace-one would be sqrt 2). T iterations
compose T such Gaussians: ``SelfComposed(Gaussian(sigma), T)``, exactly (sqrt(T)/sigma)-GDP,
certified by the PLD. Thresholding, resampling and the variation API are post-processing.
The run writes ONE ledger line for the T-fold composition (as a DP-SGD run does for its steps).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from dp_accounting import dp_event

from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger
from pipeline.privacy.rebuild import Expected, param, register

if TYPE_CHECKING:  # torch is imported where a tensor is made (the replay and the tables read this module)
    import torch

MECHANISM = "pe_nn_histogram"
#: add-or-remove-one: one record is one vote
SENSITIVITY = 1.0
PE_PLD_SETTINGS = acc.PLDSettings(value_discretization_interval=1e-4)


class PEError(ValueError):
    """Bad Private Evolution parameters or inputs; the message is one line."""


@dataclass(frozen=True)
class PEHistogramPlan:
    """T releases of the vote histogram with noise std ``sigma`` (sensitivity 1) at ``delta``."""

    sigma: float
    T: int
    delta: float

    def __post_init__(self) -> None:
        if not (isinstance(self.sigma, (int, float)) and math.isfinite(self.sigma) and self.sigma > 0):
            raise PEError(f"noise multiplier sigma must be > 0 and finite, got {self.sigma!r}")
        if isinstance(self.T, bool) or not isinstance(self.T, (int, np.integer)) or self.T < 1:
            raise PEError(f"iterations T must be an integer >= 1, got {self.T!r}")
        if not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise PEError(f"delta must be in (0, 1), got {self.delta!r}")

    @property
    def noise_std(self) -> float:
        return self.sigma * SENSITIVITY

    def event(self) -> dp_event.DpEvent:
        return histogram_event(self.sigma, self.T)

    def epsilon(self, settings: acc.PLDSettings = PE_PLD_SETTINGS) -> float:
        return acc.pld_epsilon(self.event(), self.delta, settings=settings)


def histogram_event(sigma: float, T: int) -> dp_event.DpEvent:
    """``SelfComposed(Gaussian(sigma), T)``: the T histogram releases."""
    return dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(sigma), int(T))


def calibrate(*, target_epsilon: float, delta: float, T: int, settings: acc.PLDSettings = PE_PLD_SETTINGS,
              rtol: float = 1e-3) -> PEHistogramPlan:
    """The plan with the smallest sigma (to ``rtol``) whose certified PLD eps of T releases is <=
    ``target_epsilon`` (bracket seeded by the exact sqrt(T)/sigma-GDP closed form)."""
    PEHistogramPlan(sigma=1.0, T=T, delta=delta)  # checks T and delta before any accounting
    try:
        sigma = acc.calibrate_gaussian_noise_multiplier(lambda s: histogram_event(s, T), gdp_scale=math.sqrt(T),
                                                        target_epsilon=target_epsilon, delta=delta,
                                                        settings=settings, rtol=rtol)
    except acc.AccountingError as exc:
        raise PEError(str(exc)) from None
    return PEHistogramPlan(sigma=sigma, T=T, delta=delta)


# --------------------------------------------------------------------------- the histogram

def nn_votes(private: torch.Tensor, private_labels: torch.Tensor, candidates: torch.Tensor,
             candidate_labels: torch.Tensor) -> torch.Tensor:
    """Index of each private record's nearest candidate (L2, in the embedding) among the candidates
    of its own label (Alg. 2 line 3, class-conditional). Every label of a private record must have
    at least one candidate."""
    import torch

    if private.ndim != 2 or candidates.ndim != 2 or private.shape[1] != candidates.shape[1]:
        raise PEError(f"embeddings must be [n, e] with equal e, got {list(private.shape)} and {list(candidates.shape)}")
    votes = torch.empty(len(private), dtype=torch.long)
    for y in torch.unique(private_labels).tolist():
        rows = torch.nonzero(private_labels == y).flatten()
        cols = torch.nonzero(candidate_labels == y).flatten()
        if len(cols) == 0:
            raise PEError(f"class {y} has private records but no synthetic candidate to vote for")
        d = torch.cdist(private[rows].double(), candidates[cols].double())
        votes[rows] = cols[d.argmin(dim=1)]
    return votes


def vote_histogram(votes: torch.Tensor, n_candidates: int) -> np.ndarray:
    """Counts ``[n_candidates]`` of the votes: one record is one vote (sensitivity 1)."""
    return np.bincount(votes.numpy(), minlength=n_candidates).astype(np.float64)


def noisy_histogram(counts: np.ndarray, plan: PEHistogramPlan, *, threshold: float,
                    generator: np.random.Generator) -> np.ndarray:
    """One release (Alg. 2 lines 5-6): counts + N(0, sigma^2) per bin, then max(. - threshold, 0)."""
    if threshold < 0:
        raise PEError(f"histogram threshold must be >= 0, got {threshold}")
    noisy = counts + generator.normal(0.0, plan.noise_std, size=counts.shape)
    return np.maximum(noisy - threshold, 0.0)


# --------------------------------------------------------------------------- ledger

def ledger_entry(plan: PEHistogramPlan, *, stage: str, config_id: str, seed: int,
                 settings: acc.PLDSettings = PE_PLD_SETTINGS, extra: Mapping[str, Any] | None = None
                 ) -> ledger.LedgerEntry:
    """The run's line: T Gaussians of std sigma at sensitivity 1 (add-or-remove-one)."""
    return ledger.LedgerEntry(
        stage=stage, mechanism=MECHANISM, event=ledger.event_to_dict(plan.event()), sensitivity=SENSITIVITY,
        noise_std=plan.noise_std, sampling={"scheme": "none"}, adjacency="add_or_remove_one", count=plan.T,
        delta=plan.delta, claimed_epsilon=plan.epsilon(settings),
        accountant={"name": "pld_pessimistic", **acc.describe(settings)}, config_id=config_id, seed=seed,
        extra={"pe_noise_multiplier": plan.sigma, "iterations": plan.T,
               "reference": "Private Evolution (Lin et al. 2024) Alg. 1-2", **dict(extra or {})})


def plan_from_entry(entry: ledger.LedgerEntry) -> PEHistogramPlan:
    """The plan a ``pe_nn_histogram`` line declares: what the replay recomputes and the audit runs."""
    return PEHistogramPlan(sigma=param(entry, "extra.pe_noise_multiplier"), T=param(entry, "extra.iterations", int),
                           delta=entry.delta)


@register(MECHANISM)
def _pe_histogram(entry: ledger.LedgerEntry) -> Expected:
    """T Gaussians of multiplier sigma on the vote histogram, sensitivity 1 (add-or-remove-one)."""
    plan = plan_from_entry(entry)
    return Expected(plan.event(), {"sensitivity": SENSITIVITY, "noise_std": plan.noise_std,
                                   "noise_multiplier": plan.sigma, "sampling.scheme": "none",
                                   "adjacency": "add_or_remove_one", "count": plan.T})
