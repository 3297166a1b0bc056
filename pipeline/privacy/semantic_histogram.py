"""PrivImage's one private access before DP-SGD (Li et al., USENIX Security 2024, Sec. 3.2 "semantic query"):
the noisy semantic histogram of the private labels.

A semantic query function Q (a classifier trained on the PUBLIC data's own labels, its "semantics")
is applied to every private image; each private record ``(x, y)`` votes once for each of the ``k``
semantics Q ranks highest on ``x``, in its own class's row. The class-by-semantics counts are
released by the Gaussian mechanism::

    H[c, s] = #{(x, y) in D : y = c, s in top_k(Q(x))};   H~ = H + N(0, (sqrt(k) sigma)^2 I)

and each private class keeps the ``k`` semantics of its row with the largest noisy counts
(:func:`select_semantics`): the public images of those semantics are what the diffusion model is
pretrained on, labelled by the class that chose them, before DP-SGD fine-tuning on the private data.

Sensitivity. Under ADD-OR-REMOVE-ONE adjacency a record adds or removes exactly ``k`` votes, one in
each of ``k`` DISTINCT cells of one row (top-k indices are distinct), each by 1: the L2 sensitivity of
H is sqrt(k) (PrivImage's code scales its noise by sqrt(num_words) for this reason). Replace-one moves
up to 2k cells by 1 each: sqrt(2k). The line declares add-or-remove-one, the adjacency of the DP-SGD
fine-tuning it is composed with. Q, the public data and k are public; the private set's size enters
nothing (no normalisation). One release: ``Gaussian(sigma)``, exactly (1/sigma)-GDP, certified by
the PLD. Selection, the pool's relabelling and everything after are post-processing.

What the paper leaves open and is assumed here (docs/methods/baselines.md, PrivImage): the budget
share of the query (``query_share`` of the run's target; the authors' code fixes sigma = 484 on
CIFAR-10, which is not a share of anything we can state). As in their code (one list of semantics per
class), a semantic two classes both select is pretrained as each of them
(:func:`pipeline.baselines.privimage.selected_split`).
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

MECHANISM = "privimage_semantic_histogram"
ADJACENCY = "add_or_remove_one"
#: the accountant's settings of the query's line (one Gaussian: a fine grid is cheap)
QUERY_PLD_SETTINGS = acc.PLDSettings(value_discretization_interval=1e-4)


class SemanticQueryError(ValueError):
    """Bad semantic-query parameters or inputs; the message is one line."""


def sensitivity(k: int) -> float:
    """L2 sensitivity of the class-by-semantics counts when each record votes for ``k`` distinct semantics
    (add-or-remove-one): k cells move by 1."""
    return math.sqrt(k)


@dataclass(frozen=True)
class SemanticQueryPlan:
    """One release of the semantic histogram: noise multiplier ``sigma`` (std / sensitivity), ``k`` votes per
    record, at ``delta``."""

    sigma: float
    k: int
    delta: float

    def __post_init__(self) -> None:
        if not (isinstance(self.sigma, (int, float)) and math.isfinite(self.sigma) and self.sigma > 0):
            raise SemanticQueryError(f"noise multiplier sigma must be > 0 and finite, got {self.sigma!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, (int, np.integer)) or self.k < 1:
            raise SemanticQueryError(f"k (semantics per record) must be an integer >= 1, got {self.k!r}")
        if not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise SemanticQueryError(f"delta must be in (0, 1), got {self.delta!r}")

    @property
    def sensitivity(self) -> float:
        return sensitivity(self.k)

    @property
    def noise_std(self) -> float:
        return self.sigma * self.sensitivity

    def event(self) -> dp_event.DpEvent:
        return dp_event.GaussianDpEvent(self.sigma)

    def epsilon(self, settings: acc.PLDSettings = QUERY_PLD_SETTINGS) -> float:
        return acc.pld_epsilon(self.event(), self.delta, settings=settings)


def calibrate(*, target_epsilon: float, delta: float, k: int, settings: acc.PLDSettings = QUERY_PLD_SETTINGS,
              rtol: float = 1e-3) -> SemanticQueryPlan:
    """The plan with the smallest sigma (to ``rtol``) whose certified PLD eps is <= ``target_epsilon``."""
    SemanticQueryPlan(sigma=1.0, k=k, delta=delta)  # checks k and delta before any accounting
    try:
        sigma = acc.calibrate_gaussian_noise_multiplier(dp_event.GaussianDpEvent, gdp_scale=1.0,
                                                        target_epsilon=target_epsilon, delta=delta,
                                                        settings=settings, rtol=rtol)
    except acc.AccountingError as exc:
        raise SemanticQueryError(str(exc)) from None
    return SemanticQueryPlan(sigma=sigma, k=k, delta=delta)


# --------------------------------------------------------------------------- the histogram

def top_k_semantics(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` semantics Q ranks highest for each record (``[n, k]`` distinct indices of ``logits [n, S]``)."""
    import torch

    if logits.ndim != 2:
        raise SemanticQueryError(f"semantic scores must be [n, S], got {list(logits.shape)}")
    if not 1 <= k <= logits.shape[1]:
        raise SemanticQueryError(f"k = {k} semantics per record, but Q knows {logits.shape[1]}")
    return torch.topk(logits, k, dim=1).indices


def semantic_counts(votes: np.ndarray, labels: np.ndarray, *, n_classes: int, n_semantics: int) -> np.ndarray:
    """``H [n_classes, n_semantics]``: record i adds 1 to ``H[labels[i], s]`` for each ``s`` in ``votes[i]``.

    ``votes`` is ``[n, k]`` with distinct entries per row (what :func:`top_k_semantics` gives); a repeated
    semantic in a row would move one cell by 2 and break the declared sensitivity, so it is refused.
    ``n_classes`` is the DECLARED number of private classes (a public constant), never read off the labels.
    """
    votes = np.asarray(votes, dtype=np.int64)
    labels = np.asarray(labels, dtype=np.int64)
    if votes.ndim != 2 or len(votes) != len(labels):
        raise SemanticQueryError(f"votes must be [n, k] with one row per label, got {votes.shape} for "
                                 f"{len(labels)} labels")
    if votes.size and (votes.min() < 0 or votes.max() >= n_semantics):
        raise SemanticQueryError(f"a vote is outside the {n_semantics} semantics")
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise SemanticQueryError(f"a private label is outside the declared {n_classes} classes")
    ordered = np.sort(votes, axis=1)
    if votes.shape[1] > 1 and (ordered[:, 1:] == ordered[:, :-1]).any():
        raise SemanticQueryError("a record votes twice for one semantic: its k votes must be distinct")
    H = np.zeros((n_classes, n_semantics), dtype=np.float64)
    np.add.at(H, (np.repeat(labels, votes.shape[1]), votes.reshape(-1)), 1.0)
    return H


def noisy_histogram(counts: np.ndarray, plan: SemanticQueryPlan, *, generator: np.random.Generator) -> np.ndarray:
    """The release: ``counts + N(0, (sqrt(k) sigma)^2)`` in every cell."""
    return counts + generator.normal(0.0, plan.noise_std, size=counts.shape)


def select_semantics(noisy: np.ndarray, k: int) -> np.ndarray:
    """``[n_classes, k]``: each class's ``k`` semantics with the largest noisy counts, best first (post-processing;
    ties broken by the lower index, a public rule)."""
    if not 1 <= k <= noisy.shape[1]:
        raise SemanticQueryError(f"cannot select {k} of {noisy.shape[1]} semantics per class")
    return np.argsort(-noisy, axis=1, kind="stable")[:, :k]


# --------------------------------------------------------------------------- ledger

def ledger_entry(plan: SemanticQueryPlan, *, stage: str, config_id: str, seed: int,
                 settings: acc.PLDSettings = QUERY_PLD_SETTINGS, extra: Mapping[str, Any] | None = None
                 ) -> ledger.LedgerEntry:
    """The query's line: one Gaussian of std sqrt(k) sigma at sensitivity sqrt(k) (add-or-remove-one)."""
    return ledger.LedgerEntry(
        stage=stage, mechanism=MECHANISM, event=ledger.event_to_dict(plan.event()), sensitivity=plan.sensitivity,
        noise_std=plan.noise_std, sampling={"scheme": "none"}, adjacency=ADJACENCY, count=1, delta=plan.delta,
        claimed_epsilon=plan.epsilon(settings), accountant={"name": "pld_pessimistic", **acc.describe(settings)},
        config_id=config_id, seed=seed,
        extra={"query_noise_multiplier": plan.sigma, "k": int(plan.k),
               "reference": "PrivImage (Li et al. 2024) Sec. 3.2, semantic query", **dict(extra or {})})


def plan_from_entry(entry: ledger.LedgerEntry) -> SemanticQueryPlan:
    """The plan a ``privimage_semantic_histogram`` line declares: what the replay recomputes and the audit runs."""
    return SemanticQueryPlan(sigma=param(entry, "extra.query_noise_multiplier"), k=param(entry, "extra.k", int),
                             delta=entry.delta)


@register(MECHANISM)
def _semantic_histogram(entry: ledger.LedgerEntry) -> Expected:
    """One Gaussian of multiplier sigma on the class-by-semantics counts, sensitivity sqrt(k) (add-or-remove-one)."""
    plan = plan_from_entry(entry)
    return Expected(plan.event(), {"sensitivity": plan.sensitivity, "noise_std": plan.noise_std,
                                   "noise_multiplier": plan.sigma, "sampling.scheme": "none", "adjacency": ADJACENCY,
                                   "count": 1})
