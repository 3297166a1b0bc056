"""The one private access of DP-MERF's successors: a class-conditional mean embedding of features of
norm at most 1, released once by the Gaussian mechanism.

DP-HP (Vinaroz et al. 2022, Sec. 4: Hermite polynomial features), DP-NTK (Yang et al. 2023, Sec. 3:
normalised empirical-NTK features) and DP-MEPF (Harder et al. 2023, Sec. 3: perceptual features of a
public network and their second moments) all release what DP-MERF releases (its eq. 5), with another
feature map phi::

    mu(D) = (1/m) sum_i phi(x_i) e_{y_i}^T        [F, Y]

**Sensitivity (replace-one, m public).** Every row satisfies ||phi(x)|| <= 1 (each map below is built
so, and :func:`release` checks it on every row it sums: the bound is what the sensitivity rests on,
not the code that computes phi). Replacing (x, y) by (x', y') moves mu by
(phi(x') e_{y'}^T - phi(x) e_y^T) / m, whose Frobenius norm is at most (||phi(x')|| + ||phi(x)||) / m
<= 2/m (triangle inequality), reached when y = y' and phi(x') = -phi(x) with unit norms. So the
release mu + N(0, (sigma 2/m)^2 I) is one Gaussian mechanism of multiplier sigma
(``GaussianDpEvent(sigma)``, certified by the PLD), exactly DP-MERF's line with another map. Add/remove
adjacency is not claimed: it would change the 1/m normaliser, which is the public declared size.

**Two moments or two kernels in one release.** DP-HP releases a sum-kernel and a product-kernel
embedding, DP-MEPF a first- and a second-moment embedding, each paper as two Gaussian releases with a
budget split. Here the two parts are concatenated with weights sqrt(1 - a), sqrt(a) (so ||phi|| <= 1
still holds) and released once: the same as two releases whose noise ratio is fixed by a, certified
as one Gaussian, which is never looser than composing two (assumption of this implementation; the
papers' own split is a tuning choice of theirs).

The generator matched to the release afterwards reads no private data (post-processing): the release
is the method's only ledger line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from dp_accounting import dp_event

from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger
from pipeline.privacy.dp_merf import MERF_PLD_SETTINGS, GaussianEmbeddingRelease, MerfError, mean_embedding
from pipeline.privacy.rebuild import Expected, param, register

if TYPE_CHECKING:  # torch is imported where a tensor is made (the replay and the tables read this module)
    import torch

#: the ledger mechanism of each method, and the paper section its feature map comes from
MECHANISMS = {
    "dp_hp_embedding": "DP-HP (Vinaroz et al. 2022) Sec. 4: Hermite sum + product kernel features",
    "dp_ntk_embedding": "DP-NTK (Yang et al. 2023) Sec. 3: normalised empirical-NTK features",
    "dp_mepf_embedding": "DP-MEPF (Harder et al. 2023) Sec. 3: public perceptual features, 1st + 2nd moments",
}
#: one Gaussian release: the grid of DP-MERF's line
EMBEDDING_PLD_SETTINGS = MERF_PLD_SETTINGS
#: a row may exceed norm 1 by float rounding only
NORM_TOLERANCE = 1e-6


class EmbeddingError(MerfError):
    """Bad parameters or inputs of a mean-embedding release; the message is one line."""


@dataclass(frozen=True)
class EmbeddingReleasePlan(GaussianEmbeddingRelease):
    """The release, declared before private data is read: its ``mechanism`` (a key of :data:`MECHANISMS`),
    multiplier ``sigma`` (noise std over the sensitivity 2/m), the public size ``m``, the embedding shape
    ``[feature_dim, n_classes]`` and ``delta``."""

    SIZES: ClassVar[tuple[str, ...]] = ("feature_dim", "n_classes")
    ERROR: ClassVar[type[MerfError]] = EmbeddingError

    mechanism: str
    sigma: float
    m: int
    feature_dim: int
    n_classes: int
    delta: float

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise EmbeddingError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {self.mechanism!r}")
        self._check()


def calibrate_release(mechanism: str, *, target_epsilon: float, delta: float, m: int, feature_dim: int,
                      n_classes: int, settings: acc.PLDSettings = EMBEDDING_PLD_SETTINGS,
                      rtol: float = 1e-3) -> EmbeddingReleasePlan:
    """The plan with the smallest sigma (to ``rtol``) whose certified PLD eps <= ``target_epsilon`` (one
    Gaussian is exactly (1/sigma)-GDP: the bracket starts at the closed form)."""
    try:
        sigma = acc.calibrate_gaussian_noise_multiplier(dp_event.GaussianDpEvent, gdp_scale=1.0,
                                                        target_epsilon=target_epsilon, delta=delta,
                                                        settings=settings, rtol=rtol)
    except acc.AccountingError as exc:
        raise EmbeddingError(str(exc)) from None
    return EmbeddingReleasePlan(mechanism=mechanism, sigma=sigma, m=m, feature_dim=feature_dim,
                                n_classes=n_classes, delta=delta)


def check_rows(phi: torch.Tensor, feature_dim: int) -> None:
    """Every row of ``phi [n, feature_dim]`` has norm <= 1 (the sensitivity 2/m assumes it)."""
    if phi.ndim != 2 or phi.shape[1] != feature_dim:
        raise EmbeddingError(f"private features must be [n, {feature_dim}], got {list(phi.shape)}")
    norms = phi.norm(dim=1)
    if len(norms) and not float(norms.max()) <= 1.0 + NORM_TOLERANCE:
        raise EmbeddingError(f"every feature row must have norm <= 1 (the sensitivity 2/m assumes it), got a "
                             f"row of norm {float(norms.max()):.6g}")


def release(batches: Iterable[tuple[torch.Tensor, torch.Tensor]], plan: EmbeddingReleasePlan, *,
            generator: torch.Generator) -> torch.Tensor:
    """The Gaussian mechanism on the mean embedding of the private features, given as ``(phi [n_b, F],
    labels [n_b])`` batches (a large F need not hold all m rows at once): sum_i phi_i e_{y_i}^T / m
    + N(0, (sigma 2/m)^2 I). Every row is checked (norm <= 1) and the rows must number exactly m."""
    import torch

    total, rows = None, 0
    for phi, labels in batches:
        check_rows(phi, plan.feature_dim)
        part = mean_embedding(phi.to(torch.float64), labels, plan.n_classes, m=1)  # the batch's sum
        total = part if total is None else total + part
        rows += len(phi)
    if rows != plan.m:
        raise EmbeddingError(f"the release summed {rows} private rows, the plan declares m = {plan.m}")
    mu = total / float(plan.m)
    return mu + torch.randn(mu.shape, generator=generator, dtype=mu.dtype) * plan.noise_std


# --------------------------------------------------------------------------- ledger

def ledger_entry(plan: EmbeddingReleasePlan, *, stage: str, config_id: str, seed: int,
                 settings: acc.PLDSettings = EMBEDDING_PLD_SETTINGS, extra: Mapping[str, Any] | None = None
                 ) -> ledger.LedgerEntry:
    """The release's line: one Gaussian of multiplier sigma at sensitivity 2/m (replace-one)."""
    return ledger.LedgerEntry(
        stage=stage, mechanism=plan.mechanism, event=ledger.event_to_dict(plan.event()),
        sensitivity=plan.sensitivity, noise_std=plan.noise_std, sampling={"scheme": "none"},
        adjacency="replace_one", count=1, delta=plan.delta, claimed_epsilon=plan.epsilon(settings),
        accountant={"name": "pld_pessimistic", **acc.describe(settings)}, config_id=config_id, seed=seed,
        extra={"noise_multiplier": plan.sigma, "m": plan.m, "feature_dim": plan.feature_dim,
               "n_classes": plan.n_classes, "reference": MECHANISMS[plan.mechanism], **dict(extra or {})})


def plan_from_entry(entry: ledger.LedgerEntry) -> EmbeddingReleasePlan:
    """The plan a mean-embedding line declares: what the replay recomputes and the audit runs."""
    return EmbeddingReleasePlan(mechanism=entry.mechanism, sigma=param(entry, "extra.noise_multiplier"),
                                m=param(entry, "extra.m", int), feature_dim=param(entry, "extra.feature_dim", int),
                                n_classes=param(entry, "extra.n_classes", int), delta=entry.delta)


def _rebuild(entry: ledger.LedgerEntry) -> Expected:
    """One Gaussian of multiplier sigma on the mean embedding, sensitivity 2/m (replace-one)."""
    plan = plan_from_entry(entry)
    return Expected(plan.event(), {"sensitivity": plan.sensitivity, "noise_std": plan.noise_std,
                                   "sampling.scheme": "none", "adjacency": "replace_one", "count": 1})


for _mechanism in MECHANISMS:
    register(_mechanism, size="extra.m")(_rebuild)
