"""DP-SGD's accounting: the run's plan, its event, the noise calibration and its ledger line (torch-free).

The half of :mod:`pipeline.privacy.dpsgd` that a reader of a ledger needs: the replay rebuilds a ``dpsgd`` line
from :class:`DPSGDPlan` (:mod:`pipeline.privacy.rebuild`), and the tables, the replay and the bundles certify
lines in processes that train nothing, so this module imports no torch (``tests/privacy/test_rebuild.py``).
:mod:`pipeline.privacy.dpsgd` re-exports every name, so ``dpsgd.DPSGDPlan`` is this class.

**Accounting.** sigma is calibrated BEFORE training from the whole run's event
``SelfComposed(PoissonSampled(q, Gaussian(sigma)), T)`` with the certified (pessimistic) PLD
accountant of :mod:`pipeline.privacy.accountants` (:func:`calibrate_noise_multiplier`), and
that event is the run's ledger line (:func:`ledger_entry`), which the replay recomputes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from dp_accounting import dp_event

from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger


#: default PLD settings for DP-SGD runs (thousands of compositions): h = 1e-4 keeps a
#: calibration to seconds; the value is recorded on the ledger line and the replay uses it.
DPSGD_PLD_SETTINGS = acc.PLDSettings(value_discretization_interval=1e-4)

Sampling = Literal["poisson", "fixed_size"]

class DPSGDError(ValueError):
    """Bad DP-SGD parameters; the message is one line."""


@runtime_checkable
class StepPlan(Protocol):
    """What :class:`DPSGD` reads from a plan: the sampling, T, and each step's clip and noise.

    ``noise_std_at(i)`` is the std of the Gaussian added to the SUM of the clipped gradients
    of step i (sigma_i C_i); ``time_range_at(i)`` is ``(lo, hi)`` when step i trains only
    diffusion times in [lo, hi), else ``None``. ``batch_size`` is read for fixed-size plans only.
    """

    sampling_rate: float
    dataset_size: int
    steps: int
    sampling: Sampling

    @property
    def expected_batch_size(self) -> float: ...

    @property
    def batch_size(self) -> int: ...

    def clip_at(self, step: int) -> float: ...

    def noise_std_at(self, step: int) -> float: ...

    def bucket_of(self, step: int) -> int: ...

    def time_range_at(self, step: int) -> tuple[float, float] | None: ...


# --------------------------------------------------------------------------- plan and accounting

@dataclass(frozen=True)
class DPSGDPlan:
    """The whole run's mechanism, declared before training.

    ``noise_multiplier`` sigma: noise std / clip norm C on the SUM of clipped gradients.
    ``sampling_rate`` q = expected batch / N (Poisson) or B / N (fixed size).
    """

    noise_multiplier: float
    max_grad_norm: float
    sampling_rate: float
    dataset_size: int
    steps: int
    delta: float
    sampling: Sampling = "poisson"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise DPSGDError(f"noise multiplier sigma must be > 0 and finite, got {self.noise_multiplier}")
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise DPSGDError(f"clip norm C must be > 0 and finite, got {self.max_grad_norm}")
        if not (isinstance(self.dataset_size, int) and self.dataset_size >= 1):
            raise DPSGDError(f"dataset size N must be an integer >= 1, got {self.dataset_size!r}")
        if not 0 < self.sampling_rate <= 1:
            raise DPSGDError(f"sampling rate q must be in (0, 1], got {self.sampling_rate}")
        if not (isinstance(self.steps, int) and self.steps >= 1):
            raise DPSGDError(f"number of steps T must be an integer >= 1, got {self.steps!r}")
        if not 0 < self.delta < 1:
            raise DPSGDError(f"delta must be in (0, 1), got {self.delta}")
        if self.sampling not in ("poisson", "fixed_size"):
            raise DPSGDError(f"sampling must be 'poisson' or 'fixed_size', got {self.sampling!r}")
        if self.sampling == "fixed_size":
            b = self.sampling_rate * self.dataset_size
            if abs(b - round(b)) > 1e-9 * self.dataset_size:
                raise DPSGDError(f"fixed-size batches need q*N to be an integer, got {b}")

    @property
    def expected_batch_size(self) -> float:
        """q*N: the public divisor of the noisy sum (see the module docstring, step 5)."""
        return self.sampling_rate * self.dataset_size

    @property
    def batch_size(self) -> int:
        """B of a fixed-size plan (or the rounded expected size of a Poisson plan)."""
        return int(round(self.expected_batch_size))

    @property
    def adjacency(self) -> str:
        # Poisson sampling is analysed under add/remove-one; sampling without replacement
        # only under replace-one (the dataset size is then public).
        return "add_or_remove_one" if self.sampling == "poisson" else "replace_one"

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the clipped SUM: C (add/remove), 2C (replace one record by another)."""
        return self.max_grad_norm if self.sampling == "poisson" else 2.0 * self.max_grad_norm

    @property
    def noise_std(self) -> float:
        return self.noise_multiplier * self.max_grad_norm

    # the StepPlan protocol: one mechanism for every step
    def clip_at(self, step: int) -> float:
        return self.max_grad_norm

    def noise_std_at(self, step: int) -> float:
        return self.noise_std

    def bucket_of(self, step: int) -> int:
        return 0

    def time_range_at(self, step: int) -> tuple[float, float] | None:
        return None

    def event(self) -> dp_event.DpEvent:
        """The run's ``dp_accounting`` event (T compositions of one sampled Gaussian step)."""
        return dpsgd_event(self.noise_multiplier, self.sampling_rate, self.steps, sampling=self.sampling,
                           dataset_size=self.dataset_size)

    def epsilon(self, settings: acc.PLDSettings = DPSGD_PLD_SETTINGS) -> float:
        """Certified eps at ``delta``: pessimistic PLD (Poisson) or replace-one RDP (fixed size)."""
        return _certified_epsilon(self.event(), self.delta, self.sampling, settings)


def dpsgd_event(noise_multiplier: float, sampling_rate: float, steps: int, *, sampling: Sampling = "poisson",
                dataset_size: int | None = None) -> dp_event.DpEvent:
    """``SelfComposed(PoissonSampled(q, Gaussian(sigma)), T)``, or for fixed-size batches
    ``SelfComposed(SampledWithoutReplacement(N, B, Gaussian(sigma / 2)), T)``.

    The fixed-size Gaussian carries sigma/2 because dp_accounting's noise multiplier is
    std / (replace-one sensitivity) and replacing one record moves the clipped sum by up to 2C.
    """
    if sampling == "poisson":
        step = dp_event.PoissonSampledDpEvent(sampling_rate, dp_event.GaussianDpEvent(noise_multiplier))
    elif sampling == "fixed_size":
        if dataset_size is None:
            raise DPSGDError("fixed-size sampling needs the dataset size N")
        step = dp_event.SampledWithoutReplacementDpEvent(
            dataset_size, int(round(sampling_rate * dataset_size)), dp_event.GaussianDpEvent(noise_multiplier / 2.0))
    else:
        raise DPSGDError(f"sampling must be 'poisson' or 'fixed_size', got {sampling!r}")
    return dp_event.SelfComposedDpEvent(step, steps)


def _certified_epsilon(event: dp_event.DpEvent, delta: float, sampling: Sampling, settings: acc.PLDSettings) -> float:
    if sampling == "poisson":
        return acc.pld_epsilon(event, delta, settings=settings)
    # dp_accounting's PLD has no sampling-without-replacement event; its RDP accountant has
    # one, valid only under replace-one (Wang, Balle & Kasiviswanathan 2019, Thm 27).
    return acc.rdp_epsilon(event, delta, replace_one=True)


def calibrate_noise_multiplier(*, target_epsilon: float, delta: float, sampling_rate: float, steps: int,
                               sampling: Sampling = "poisson", dataset_size: int | None = None,
                               settings: acc.PLDSettings = DPSGD_PLD_SETTINGS, rtol: float = 1e-3,
                               bracket: tuple[float, float] = (0.2, 200.0),
                               prior: Sequence[dp_event.DpEvent] = ()) -> float:
    """Smallest sigma (to relative tolerance ``rtol``) whose certified eps <= ``target_epsilon``.

    ``prior``: the events of releases the same run made earlier on the same private data (PrivImage's
    semantic query); sigma is then calibrated so that their composition WITH the DP-SGD event meets
    the target (one PLD of ``Composed(prior + [DP-SGD])``, the composition the run's tables certify).

    Bisection on log sigma rather than ``dp_accounting.mechanism_calibration`` because the
    latter needs a ``PrivacyAccountant`` and dp_accounting's ``PLDAccountant`` hides the
    log-mass truncation that :mod:`.accountants` records on every ledger line. Invariant:
    eps(hi) <= target < eps(lo); the returned ``hi`` is therefore certified, and a sigma
    smaller by more than ``rtol`` exceeds the budget.
    """
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise DPSGDError(f"target epsilon must be > 0 and finite, got {target_epsilon}")
    eps_of = lambda s: _certified_epsilon(  # noqa: E731
        after_prior(prior, dpsgd_event(s, sampling_rate, steps, sampling=sampling, dataset_size=dataset_size),
                    sampling), delta, sampling, settings)
    lo, hi = bracket
    if eps_of(hi) > target_epsilon:
        raise DPSGDError(f"target eps {target_epsilon} at delta {delta} unreachable with sigma <= {hi} "
                         f"(q={sampling_rate}, T={steps}); lower q or T")
    if eps_of(lo) <= target_epsilon:
        raise DPSGDError(f"target eps {target_epsilon} is met already at sigma = {lo}; widen the bracket")
    return acc.bisect_log_sigma(eps_of, lo, hi, target_epsilon, rtol)


def after_prior(prior: Sequence[dp_event.DpEvent], event: dp_event.DpEvent, sampling: Sampling) -> dp_event.DpEvent:
    """``event`` composed after the ``prior`` releases of the same run (itself when there are none). Only a Poisson
    DP-SGD composes: the PLD certifies the composition, the fixed-size RDP path does not take one."""
    if not prior:
        return event
    if sampling != "poisson":
        raise DPSGDError("a DP-SGD run composed with earlier releases needs Poisson sampling (PLD accounting)")
    return dp_event.ComposedDpEvent([*prior, event])


def composed_epsilon(prior: Sequence[dp_event.DpEvent], plan: DPSGDPlan,
                     settings: acc.PLDSettings = DPSGD_PLD_SETTINGS) -> float:
    """Certified eps of ``prior`` releases composed with ``plan``'s DP-SGD (Poisson, PLD): the run's eps when
    DP-SGD follows an earlier release on the same data (PrivImage)."""
    return acc.pld_epsilon(after_prior(prior, plan.event(), plan.sampling), plan.delta, settings=settings)


def plan_for_budget(*, target_epsilon: float, delta: float, max_grad_norm: float, batch_size: int,
                    dataset_size: int, steps: int, sampling: Sampling = "poisson",
                    settings: acc.PLDSettings = DPSGD_PLD_SETTINGS, rtol: float = 1e-3,
                    prior: Sequence[dp_event.DpEvent] = ()) -> DPSGDPlan:
    """The plan of a run with (expected) batch ``batch_size``: q = batch/N, sigma calibrated (with ``prior``
    releases composed in, :func:`calibrate_noise_multiplier`)."""
    if not 1 <= batch_size <= dataset_size:
        raise DPSGDError(f"batch size must be in [1, N={dataset_size}], got {batch_size}")
    q = batch_size / dataset_size
    sigma = calibrate_noise_multiplier(target_epsilon=target_epsilon, delta=delta, sampling_rate=q, steps=steps,
                                       sampling=sampling, dataset_size=dataset_size, settings=settings, rtol=rtol,
                                       prior=prior)
    return DPSGDPlan(noise_multiplier=sigma, max_grad_norm=max_grad_norm, sampling_rate=q,
                     dataset_size=dataset_size, steps=steps, delta=delta, sampling=sampling)


def dpsgd_steps(*, dataset_size: int, batch_size: int, epochs: float, steps: int | None = None) -> int:
    """T, the run's DP-SGD steps: ``steps`` when set, else ``ceil(epochs N / batch_size)`` (at least one), N the
    declared size of the private set. One formula for the stages that train and the wirings that register what
    their lines must say."""
    return steps if steps is not None else max(1, math.ceil(epochs * dataset_size / batch_size))


def configured_line(*, dataset_size: int, batch_size: int, steps: int, max_grad_norm: float) -> dict[str, Any]:
    """What a Poisson DP-SGD run's line (:func:`ledger_entry`) must say of the parameters its configuration fixes:
    N, the expected batch, T and the clip (dotted line paths; sigma is calibrated, so it is held to its target eps
    instead). The registration a method's wiring gives the replay (pipeline.registry.TranscriptSpec.params)."""
    return {"sampling.scheme": "poisson", "sampling.n": dataset_size, "extra.expected_batch_size": batch_size,
            "count": steps, "extra.max_grad_norm": max_grad_norm}


def ledger_entry(plan: DPSGDPlan, *, stage: str, config_id: str, seed: int,
                 settings: acc.PLDSettings = DPSGD_PLD_SETTINGS, extra: Mapping[str, Any] | None = None
                 ) -> ledger.LedgerEntry:
    """The run's ledger line: its whole event and the certified eps claimed for it.

    Noise multiplicity K is deliberately absent: it changes no part of the mechanism.
    """
    if plan.sampling == "poisson":
        sampling = {"scheme": "poisson", "probability": plan.sampling_rate, "n": plan.dataset_size}
        accountant = {"name": "pld_pessimistic", **acc.describe(settings)}
    else:
        sampling = {"scheme": "fixed_size_per_step", "probability": plan.sampling_rate,
                    "B": plan.batch_size, "n": plan.dataset_size}
        accountant = {"name": "rdp", "orders": None, "neighboring_relation": "replace_one"}
    return ledger.LedgerEntry(
        stage=stage, mechanism="dpsgd", event=ledger.event_to_dict(plan.event()),
        sensitivity=plan.sensitivity, noise_std=plan.noise_std, sampling=sampling, adjacency=plan.adjacency,
        count=plan.steps, delta=plan.delta, claimed_epsilon=plan.epsilon(settings), accountant=accountant,
        config_id=config_id, seed=seed,
        extra={"max_grad_norm": plan.max_grad_norm, "dpsgd_noise_multiplier": plan.noise_multiplier,
               "expected_batch_size": plan.expected_batch_size, "reference": "Abadi et al. 2016; DPDM App. A",
               **dict(extra or {})})
