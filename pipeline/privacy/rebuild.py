"""Rebuild a ledger line's ``dp_accounting`` event from the mechanism parameters on that line.

A line carries both the serialised event the eps was computed from and the parameters of the
mechanism that ran (EMPDEN: the EDM schedule, k, C, beta, B, n, N_out; DP-SGD: sigma, C, the
expected or fixed batch, N, T). The replay (:mod:`pipeline.privacy.replay`) recomputes eps
from the event; this module makes sure that event is the one the parameters imply, so a line
whose event was edited (e.g. mu_bar_B and q halved while B/n still says 0.02) is refused
instead of certifying a smaller eps.

Each mechanism name registers one rebuilder, and every rebuilder calls the code the mechanism
itself used to build its line (:class:`pipeline.privacy.empden_block.EmpdenBlock`,
:meth:`pipeline.privacy.dpsgd.DPSGDPlan.event`), so each formula exists once. A
mechanism without a rebuilder cannot be checked and is refused, never passed.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dp_accounting import dp_event

from pipeline.diffusion.schedule import EDMSchedule
from pipeline.privacy import accountants as acc
from pipeline.privacy.dpsgd_plan import DPSGDPlan, Sampling
from pipeline.privacy import ledger
from pipeline.privacy.empden_block import MECHANISM_NAMES, EmpdenBlock, Scheme

#: relative tolerance when comparing a stored float with its rebuilt value: the same code on
#: the same parameters agrees to the last few ulps; a real edit differs by far more.
REL_TOL = 1e-9


class RebuildError(ledger.LedgerError):
    """A line whose event cannot be rebuilt or differs from its rebuild; one line of text."""


@dataclass(frozen=True)
class Expected:
    """What a line's parameters imply: its event and the values of the line's derived fields.

    ``fields`` maps a dotted path into the line (``"sampling.probability"``,
    ``"extra.mu_bar_B"``) to the value the parameters give it.
    """

    event: dp_event.DpEvent
    fields: dict[str, Any]


Rebuilder = Callable[[ledger.LedgerEntry], Expected]
REBUILDERS: dict[str, Rebuilder] = {}
#: mechanism -> the dotted path of its line that holds the size N of the private set it read (``sampling.n``,
#: ``extra.N``, ``extra.m``), for mechanisms whose accounting depends on N: the replay holds it to the split's manifest
SIZE_FIELDS: dict[str, str] = {}


def register(mechanism: str, *, size: str | None = None) -> Callable[[Rebuilder], Rebuilder]:
    """Register the rebuilder of the ledger lines whose ``mechanism`` is ``mechanism``; ``size``: where its line
    declares the private set's size N, when its event depends on it (a sampling rate B/N, a sensitivity 2/N)."""
    def wrap(fn: Rebuilder) -> Rebuilder:
        if mechanism in REBUILDERS:
            raise ValueError(f"mechanism {mechanism!r} already has a rebuilder")
        REBUILDERS[mechanism] = fn
        if size is not None:
            SIZE_FIELDS[mechanism] = size
        return fn
    return wrap


def size_field(mechanism: str) -> str | None:
    """Where a ``mechanism`` line declares the size N of the private set (None: its event does not depend on N)."""
    load_rebuilders()
    return SIZE_FIELDS.get(mechanism)


_LOADED = False

#: the training engines of pipeline.privacy: torch modules that register no rebuilder (their mechanisms' lines are
#: rebuilt from the torch-free accounting: dpsgd_plan, empden_block), left out of the discovery so a process that
#: only reads ledgers (the replay, the tables, a bundle's check) never imports torch
#: (tests/privacy/test_rebuild.py imports them and checks they register nothing)
ENGINES = ("dpsgd", "ghost", "empirical_denoiser")


def load_rebuilders() -> None:
    """Import every module of :mod:`pipeline.privacy` but the :data:`ENGINES` once, so each mechanism registers its
    rebuilder: a new mechanism is one new file there, and the replay finds it without a list to edit."""
    global _LOADED
    if _LOADED:
        return
    package = importlib.import_module("pipeline.privacy")
    for info in pkgutil.iter_modules(package.__path__):
        if info.name not in ENGINES:
            importlib.import_module(f"pipeline.privacy.{info.name}")
    _LOADED = True


# --------------------------------------------------------------------------- reading parameters

#: what :func:`lookup` returns for a path the line lacks
MISSING = object()
_MISSING = MISSING


def lookup(entry: ledger.LedgerEntry, path: str) -> Any:
    """The value at dotted ``path`` of the line (``sampling.n``, ``extra.k_steps``), or :data:`MISSING`."""
    head, *rest = path.split(".")
    value: Any = getattr(entry, head, _MISSING)
    for key in rest:
        value = value.get(key, _MISSING) if isinstance(value, Mapping) else _MISSING
    return value


def param(entry: ledger.LedgerEntry, path: str, kind: type = float) -> Any:
    """The mechanism parameter at ``path`` of the line, as ``kind``; a missing or ill-typed one raises."""
    value = lookup(entry, path)
    if value is _MISSING or value is None:
        raise RebuildError(f"mechanism {entry.mechanism!r}: the line lacks parameter {path}, needed to rebuild "
                           f"its event")
    if kind is str:
        if not isinstance(value, str):
            raise RebuildError(f"mechanism {entry.mechanism!r}: parameter {path} must be a string, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RebuildError(f"mechanism {entry.mechanism!r}: parameter {path} must be a finite number, got {value!r}")
    if kind is int:
        if value != int(value):
            raise RebuildError(f"mechanism {entry.mechanism!r}: parameter {path} must be an integer, got {value!r}")
        return int(value)
    return float(value)


def _edm_schedule(entry: ledger.LedgerEntry) -> EDMSchedule:
    return EDMSchedule(sigma_min=param(entry, "extra.sigma_min"), sigma_max=param(entry, "extra.sigma_max"),
                       rho=param(entry, "extra.rho"), N=param(entry, "extra.N", int))


def _empden_block(entry: ledger.LedgerEntry, scheme: Scheme) -> EmpdenBlock:
    """The EMPDEN block a line's parameters describe (C is the clip norm eq. 39 used, already scaled)."""
    n = param(entry, "sampling.n", int)
    B = n if scheme == "full_batch" else param(entry, "sampling.B", int)
    return EmpdenBlock(schedule=_edm_schedule(entry), k=param(entry, "extra.k_steps", int), C=param(entry, "extra.C"),
                       beta=param(entry, "extra.beta"), B=B, n=n, N_out=entry.count, scheme=scheme)



def empden_block(entry: ledger.LedgerEntry) -> EmpdenBlock:
    """The block an EMPDEN sampler run's line declares (its scheme from the mechanism name): what the
    replay recomputes and the one-run audit runs (:mod:`pipeline.audit.empden_canaries`)."""
    schemes = {name: scheme for scheme, name in MECHANISM_NAMES.items()}
    if entry.mechanism not in schemes:
        raise RebuildError(f"mechanism {entry.mechanism!r} is not an EMPDEN block ({', '.join(schemes)})")
    return _empden_block(entry, schemes[entry.mechanism])


# --------------------------------------------------------------------------- the rebuilders

@register("empden_outputwise_block", size="sampling.n")
def _empden_outputwise(entry: ledger.LedgerEntry) -> Expected:
    """Algorithm 1 / Prop. 4.1: mu_bar_B (eq. 9) of the k-step block over B records, q_B = B/n."""
    if entry.extra.get("source") == "given":
        # a configuration claim for a mu_bar_B given directly (App. G): no schedule behind it
        B, n = param(entry, "sampling.B", int), param(entry, "sampling.n", int)
        mu_bar = param(entry, "extra.mu_bar_B")
        event, q = acc.outputwise_event(mu_bar, B / n, entry.count), B / n
    else:
        block = _empden_block(entry, "per_output")
        event, mu_bar, q = block.event, block.mu_bar_B, block.q_B
    return Expected(event, {"noise_multiplier": 1.0 / mu_bar, "extra.mu_bar_B": mu_bar,
                            "sampling.scheme": "fixed_size_per_output", "sampling.probability": q,
                            "adjacency": "add_or_remove_one"})


@register("empden_per_step_subsampled", size="sampling.n")
def _empden_per_step(entry: ledger.LedgerEntry) -> Expected:
    """Prop. C.1: a fresh B-subset at each of the k private steps, each mu_t (eq. 39) amplified by B/n."""
    m = _empden_block(entry, "per_step").mechanism()
    return Expected(m.event, {"noise_multiplier": 1.0 / m.mu_core, "sampling.scheme": "fixed_size_per_step",
                              "sampling.probability": m.q, "adjacency": "add_or_remove_one"})


@register("empden_full_batch", size="sampling.n")
def _empden_full_batch(entry: ledger.LedgerEntry) -> Expected:
    """Sec. 3.2: k steps over all n records, composed exactly in GDP."""
    m = _empden_block(entry, "full_batch").mechanism()
    return Expected(m.event, {"noise_multiplier": 1.0 / m.mu_core, "sampling.scheme": "none",
                              "extra.mu_total": acc.gdp_mu_of_event(m.event), "adjacency": "add_or_remove_one"})


_DPSGD_SCHEMES: dict[str, Sampling] = {"poisson": "poisson", "fixed_size_per_step": "fixed_size"}


def dpsgd_plan(entry: ledger.LedgerEntry) -> DPSGDPlan:
    """The DP-SGD plan a ``dpsgd`` line's parameters declare (the replay's rebuild and the audit's plan).

    q is rebuilt from the batch, not read from the event: the expected batch size q N
    (Poisson) or the fixed batch B (sampling without replacement), over N.
    """
    scheme = param(entry, "sampling.scheme", str)
    if scheme not in _DPSGD_SCHEMES:
        raise RebuildError(f"mechanism 'dpsgd': sampling scheme {scheme!r} is not one DP-SGD runs "
                           f"({', '.join(_DPSGD_SCHEMES)})")
    sampling = _DPSGD_SCHEMES[scheme]
    n = param(entry, "sampling.n", int)
    batch = param(entry, "extra.expected_batch_size") if sampling == "poisson" else param(entry, "sampling.B", int)
    return DPSGDPlan(noise_multiplier=param(entry, "extra.dpsgd_noise_multiplier"),
                     max_grad_norm=param(entry, "extra.max_grad_norm"), sampling_rate=batch / n,
                     dataset_size=n, steps=entry.count, delta=entry.delta, sampling=sampling)


@register("dpsgd", size="sampling.n")
def _dpsgd(entry: ledger.LedgerEntry) -> Expected:
    """DP-SGD (Abadi et al. 2016; DPDM App. A): T steps of a sampled Gaussian with multiplier sigma."""
    plan = dpsgd_plan(entry)
    fields: dict[str, Any] = {"sensitivity": plan.sensitivity, "noise_std": plan.noise_std,
                              "sampling.probability": plan.sampling_rate, "adjacency": plan.adjacency}
    if entry.accountant.get("name") == "rdp":
        # dp_accounting's RDP defaults to add/remove; the relation must be the line's adjacency
        fields["accountant.neighboring_relation"] = plan.adjacency
    return Expected(plan.event(), fields)


# --------------------------------------------------------------------------- comparing

def rebuild(entry: ledger.LedgerEntry) -> Expected:
    """The event and derived fields ``entry``'s own parameters imply."""
    load_rebuilders()
    fn = REBUILDERS.get(entry.mechanism)
    if fn is None:
        raise RebuildError(f"mechanism {entry.mechanism!r} has no registered rebuilder (known: "
                           f"{', '.join(sorted(REBUILDERS))}), so its event cannot be checked")
    try:
        return fn(entry)
    except RebuildError:
        raise
    except (ValueError, acc.AccountingError) as exc:  # DPSGDError, EDMSchedule, ... are ValueErrors
        raise RebuildError(f"mechanism {entry.mechanism!r}: its parameters build no valid mechanism ({exc})") from None


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values, numbers to :data:`REL_TOL` (the same code on the same parameters agrees to ulps)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=0.0)
    return a == b


def differences(stored: Any, rebuilt: Any, where: str) -> list[str]:
    """Every place ``stored`` and ``rebuilt`` (plain JSON data) differ, as text."""
    if isinstance(stored, Mapping) and isinstance(rebuilt, Mapping):
        out = []
        for key in sorted(set(stored) | set(rebuilt)):
            if key not in stored or key not in rebuilt:
                out.append(f"{where}.{key}: {'missing from the line' if key not in stored else 'not expected'}")
            else:
                out += differences(stored[key], rebuilt[key], f"{where}.{key}")
        return out
    if isinstance(stored, list) and isinstance(rebuilt, list):
        if len(stored) != len(rebuilt):
            return [f"{where}: {len(stored)} items, the parameters give {len(rebuilt)}"]
        return [d for i, (s, r) in enumerate(zip(stored, rebuilt)) for d in differences(s, r, f"{where}[{i}]")]
    if not same(stored, rebuilt):
        return [f"{where} is {stored!r}, the parameters give {rebuilt!r}"]
    return []


def mismatches(entry: ledger.LedgerEntry, expected: Expected) -> list[str]:
    """Every way the line differs from what its parameters imply (empty if it matches)."""
    out = differences(entry.event, ledger.event_to_dict(expected.event), "event")
    for path, value in expected.fields.items():
        stored = lookup(entry, path)
        if stored is _MISSING:
            out.append(f"{path} missing from the line")
        elif not same(stored, value):
            out.append(f"{path} is {stored!r}, the parameters give {value!r}")
    return out


def check(entry: ledger.LedgerEntry) -> None:
    """Raise :class:`RebuildError` unless ``entry``'s event and fields are exactly what its parameters imply."""
    found = mismatches(entry, rebuild(entry))
    if found:
        more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
        raise RebuildError(f"mechanism {entry.mechanism!r}: {found[0]}{more}; the event does not match the "
                           f"line's mechanism parameters")
