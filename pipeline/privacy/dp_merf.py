"""DP-MERF's one private access (Harder, Adamczewski & Park 2021): a noisy mean embedding.

Random Fourier features (Rahimi & Recht 2007) of the Gaussian kernel k(x, x') =
exp(-||x - x'||^2 / (2 l^2)), with D frequencies w_j ~ N(0, l^-2 I) drawn from public randomness::

    phi(x) = D^{-1/2} [cos(w_1 . x), ..., cos(w_D . x), sin(w_1 . x), ..., sin(w_D . x)]

so ||phi(x)|| = 1 EXACTLY for every x (cos^2 + sin^2 = 1; DP-MERF Sec. 3 writes the same map with
2D features). The class-conditional mean embedding (DP-MERF eq. 5, one-hot label features) is

    mu(D) = (1/m) sum_i phi(x_i) e_{y_i}^T       [2D, Y]

and each summand has Frobenius norm 1, so under REPLACE-ONE adjacency (m is public) the L2
sensitivity is ||mu(D) - mu(D')||_F = ||phi(x) e_y^T - phi(x') e_y'^T||_F / m <= 2/m (triangle
inequality; DP-MERF Sec. 3.2). A replacement that changes the label moves the embedding by exactly
sqrt(2)/m (two orthogonal columns), one that keeps it by ||phi(x) - phi(x')||/m, up to 2/m when
phi(x') = -phi(x). The release mu + N(0, (sigma 2/m)^2 I) is one
Gaussian mechanism of multiplier sigma: ``GaussianDpEvent(sigma)``, certified by the PLD. The
generator that matches the released embedding afterwards touches no private data
(post-processing), so this is the method's only ledger line.

The feature map is part of the mechanism (the sensitivity rests on ||phi|| = 1), so it lives
here; it is written in torch because the generator is trained through it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from dp_accounting import dp_event

from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger
from pipeline.privacy.rebuild import Expected, param, register

if TYPE_CHECKING:  # torch is imported where a tensor is made (the replay and the tables read this module)
    import torch

MECHANISM = "dp_merf_embedding"
#: the release is one Gaussian; h = 1e-4 as for the other single releases (replay ~1 s per line)
MERF_PLD_SETTINGS = acc.PLDSettings(value_discretization_interval=1e-4)


class MerfError(ValueError):
    """Bad DP-MERF parameters or inputs; the message is one line."""


def embedding_sensitivity(m: int) -> float:
    """Replace-one L2 (Frobenius) sensitivity of the mean embedding of m records: 2/m."""
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise MerfError(f"the private set size m must be an integer >= 1, got {m!r}")
    return 2.0 / float(m)


class GaussianEmbeddingRelease:
    """What a mean-embedding release plan is (DP-MERF's, and its successors' in
    :mod:`pipeline.privacy.mean_embedding`): one Gaussian of multiplier ``sigma`` at the replace-one sensitivity
    2/m of a public ``m``, at ``delta``; the subclass's dataclass holds the fields and names its integer sizes in
    ``SIZES`` and its error in ``ERROR``."""

    SIZES: ClassVar[tuple[str, ...]] = ()
    ERROR: ClassVar[type[MerfError]] = MerfError

    def _check(self) -> None:
        sigma, delta = getattr(self, "sigma"), getattr(self, "delta")
        if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
            raise self.ERROR(f"noise multiplier sigma must be > 0 and finite, got {sigma!r}")
        try:
            embedding_sensitivity(getattr(self, "m"))
        except MerfError as exc:
            raise self.ERROR(str(exc)) from None
        for name in self.SIZES:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise self.ERROR(f"{name} must be an integer >= 1, got {v!r}")
        if not (isinstance(delta, (int, float)) and 0 < delta < 1):
            raise self.ERROR(f"delta must be in (0, 1), got {delta!r}")

    @property
    def sensitivity(self) -> float:
        return embedding_sensitivity(getattr(self, "m"))

    @property
    def noise_std(self) -> float:
        """Std of the noise on every entry of the embedding: sigma * 2/m."""
        return getattr(self, "sigma") * self.sensitivity

    def event(self) -> dp_event.DpEvent:
        return dp_event.GaussianDpEvent(getattr(self, "sigma"))

    def epsilon(self, settings: acc.PLDSettings = MERF_PLD_SETTINGS) -> float:
        return acc.pld_epsilon(self.event(), getattr(self, "delta"), settings=settings)


@dataclass(frozen=True)
class MerfReleasePlan(GaussianEmbeddingRelease):
    """The release, declared before private data is read: multiplier ``sigma`` (noise std over the
    sensitivity 2/m), the public size ``m``, the embedding shape ``[2D, Y]`` and ``delta``."""

    SIZES: ClassVar[tuple[str, ...]] = ("n_features", "n_classes")

    sigma: float
    m: int
    n_features: int
    n_classes: int
    delta: float

    def __post_init__(self) -> None:
        self._check()


def calibrate_release(*, target_epsilon: float, delta: float, m: int, n_features: int, n_classes: int,
                      settings: acc.PLDSettings = MERF_PLD_SETTINGS, rtol: float = 1e-3) -> MerfReleasePlan:
    """The plan with the smallest sigma (to ``rtol``) whose certified PLD eps <= ``target_epsilon``
    (one Gaussian is exactly (1/sigma)-GDP: the bracket starts at the closed form)."""
    try:
        sigma = acc.calibrate_gaussian_noise_multiplier(dp_event.GaussianDpEvent, gdp_scale=1.0,
                                                        target_epsilon=target_epsilon, delta=delta,
                                                        settings=settings, rtol=rtol)
    except acc.AccountingError as exc:
        raise MerfError(str(exc)) from None
    return MerfReleasePlan(sigma=sigma, m=m, n_features=n_features, n_classes=n_classes, delta=delta)


# --------------------------------------------------------------------------- the feature map

def rff_frequencies(dim: int, n_features: int, length_scale: float, generator: torch.Generator) -> torch.Tensor:
    """``W [D, dim]`` with rows w_j ~ N(0, l^-2 I): the Gaussian kernel of bandwidth l (public randomness)."""
    import torch

    if not (math.isfinite(length_scale) and length_scale > 0):
        raise MerfError(f"kernel length scale must be > 0 and finite, got {length_scale!r}")
    if n_features < 1 or dim < 1:
        raise MerfError(f"need n_features >= 1 and dim >= 1, got {n_features}, {dim}")
    return torch.randn((n_features, dim), generator=generator, dtype=torch.float64) / float(length_scale)


def rff_features(x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """phi(x) ``[n, 2D]`` of flattened inputs ``x [n, dim]``: unit norm for every row."""
    import torch

    proj = x.to(W.dtype) @ W.T
    return torch.cat([torch.cos(proj), torch.sin(proj)], dim=1) / math.sqrt(W.shape[0])


def mean_embedding(phi: torch.Tensor, labels: torch.Tensor, n_classes: int, m: int | None = None) -> torch.Tensor:
    """(1/m) sum_i phi(x_i) e_{y_i}^T ``[2D, Y]`` (m defaults to the number of rows)."""
    import torch

    if labels.min() < 0 or labels.max() >= n_classes:
        raise MerfError(f"labels must lie in 0..{n_classes - 1}, got {int(labels.min())}..{int(labels.max())}")
    onehot = torch.nn.functional.one_hot(labels.long(), n_classes).to(phi.dtype)
    return phi.T @ onehot / float(len(phi) if m is None else m)


def release(phi: torch.Tensor, labels: torch.Tensor, plan: MerfReleasePlan, *,
            generator: torch.Generator) -> torch.Tensor:
    """The Gaussian mechanism on the mean embedding of the private features ``phi [m, 2D]``
    (rows of norm 1, checked: the sensitivity rests on it): mu + N(0, (sigma 2/m)^2 I)."""
    import torch

    if phi.shape != (plan.m, 2 * plan.n_features):
        raise MerfError(f"private features must be [m, 2D] = [{plan.m}, {2 * plan.n_features}], got "
                        f"{list(phi.shape)}")
    norms = phi.norm(dim=1)
    if not torch.allclose(norms, torch.ones_like(norms), atol=1e-9):
        raise MerfError(f"every feature row must have norm 1 (the sensitivity 2/m assumes it), got norms in "
                        f"[{float(norms.min()):.6g}, {float(norms.max()):.6g}]")
    mu = mean_embedding(phi, labels, plan.n_classes, plan.m)
    noise = torch.randn(mu.shape, generator=generator, dtype=mu.dtype) * plan.noise_std
    return mu + noise


# --------------------------------------------------------------------------- ledger

def ledger_entry(plan: MerfReleasePlan, *, stage: str, config_id: str, seed: int,
                 settings: acc.PLDSettings = MERF_PLD_SETTINGS, extra: Mapping[str, Any] | None = None
                 ) -> ledger.LedgerEntry:
    """The release's line: one Gaussian of multiplier sigma at sensitivity 2/m (replace-one)."""
    return ledger.LedgerEntry(
        stage=stage, mechanism=MECHANISM, event=ledger.event_to_dict(plan.event()), sensitivity=plan.sensitivity,
        noise_std=plan.noise_std, sampling={"scheme": "none"}, adjacency="replace_one", count=1, delta=plan.delta,
        claimed_epsilon=plan.epsilon(settings), accountant={"name": "pld_pessimistic", **acc.describe(settings)},
        config_id=config_id, seed=seed,
        extra={"merf_noise_multiplier": plan.sigma, "m": plan.m, "n_features": plan.n_features,
               "n_classes": plan.n_classes, "reference": "DP-MERF (Harder et al. 2021) Sec. 3.2",
               **dict(extra or {})})


def plan_from_entry(entry: ledger.LedgerEntry) -> MerfReleasePlan:
    """The plan a ``dp_merf_embedding`` line declares: what the replay recomputes and the audit runs."""
    return MerfReleasePlan(sigma=param(entry, "extra.merf_noise_multiplier"), m=param(entry, "extra.m", int),
                           n_features=param(entry, "extra.n_features", int),
                           n_classes=param(entry, "extra.n_classes", int), delta=entry.delta)


@register(MECHANISM, size="extra.m")
def _dp_merf(entry: ledger.LedgerEntry) -> Expected:
    """One Gaussian of multiplier sigma on the mean embedding, sensitivity 2/m (replace-one)."""
    plan = plan_from_entry(entry)
    return Expected(plan.event(), {"sensitivity": plan.sensitivity, "noise_std": plan.noise_std,
                                   "noise_multiplier": plan.sigma, "sampling.scheme": "none",
                                   "adjacency": "replace_one", "count": 1})
