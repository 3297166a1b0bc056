"""The privacy ledger: one JSON line per private mechanism execution.

Every private mechanism, in every method, appends one line to
``results/<experiment>/ledger/<stage>.jsonl`` (SPEC, Methods/Accounting). A line is a
serialised ``dp_accounting`` event (what ran) plus the human-readable parameters it was
built from and the claim made about it::

    {"format": "dpgen-ledger/1", "stage": "sample_hybrid", "mechanism": "outputwise_subsampled_gaussian",
     "event": {"class_name": "SelfComposedDpEvent", "count": 50000, "event": {...}},
     "sensitivity": 1.0, "noise_multiplier": 0.478, "noise_std": 0.478,
     "sampling": {"scheme": "fixed_size_per_output", "probability": 0.0005},
     "adjacency": "add_or_remove_one", "count": 50000, "delta": 1e-05,
     "claimed_epsilon": 6.29, "accountant": {"name": "pld_pessimistic", ...},
     "versions": {...}, "config_id": "...", "seed": 0, "time_utc": "...",
     "run": "empden_sample_hybrid_p50_B200_T3_beta1_s0", "experiment": "digits", "data_sha256": "...", "seq": 0}

The last four fields bind the line to where it was written (:class:`Binding`): the run the
stage was run for, the experiment, the sha256 of the private split the mechanism read (from
the split's manifest) and the line's position in its transcript. The replay checks them
against the run each transcript is registered for, so a transcript swapped between runs, a
line copied into another transcript or handed in twice, or a line of another experiment is
refused (:mod:`pipeline.privacy.replay`).

The replay (:mod:`pipeline.privacy.replay`) feeds each event to a fresh accountant and
compares; a mechanism never computes its own eps. Only certified accountants may appear
in a claim (``pld_pessimistic``, ``rdp``, ``gdp``): estimates are refused at write time.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import attr
from dp_accounting import dp_event

from pipeline.stage import PipelineError

#: /2: every line carries its binding (run, experiment, data_sha256, seq); /1 lines are refused (rerun the stage)
LEDGER_FORMAT = "dpgen-ledger/2"

#: accountants whose eps is an upper bound and may therefore be claimed.
CERTIFIED_ACCOUNTANTS = ("pld_pessimistic", "rdp", "gdp")
SAMPLING_SCHEMES = ("none", "poisson", "fixed_size_per_output", "fixed_size_per_step")
ADJACENCIES = ("add_or_remove_one", "replace_one")


class LedgerError(ValueError):
    """A malformed or inconsistent ledger line; the message names file and line."""


class BindingError(LedgerError, PipelineError):
    """A stage asked to write a ledger line without saying which run and data it belongs to (one line)."""


# --------------------------------------------------------------------------- events <-> JSON

def event_to_dict(event: dp_event.DpEvent) -> dict[str, Any]:
    """A ``dp_accounting`` event as nested plain data: ``class_name`` plus its attrs fields."""
    if not isinstance(event, dp_event.DpEvent):
        raise LedgerError(f"not a dp_accounting event: {event!r}")
    out: dict[str, Any] = {"class_name": type(event).__name__}
    for name, value in attr.asdict(event, recurse=False).items():
        if isinstance(value, dp_event.DpEvent):
            value = event_to_dict(value)
        elif isinstance(value, (list, tuple)):
            value = [event_to_dict(v) if isinstance(v, dp_event.DpEvent) else v for v in value]
        out[name] = value
    return out


def event_from_dict(data: Mapping[str, Any]) -> dp_event.DpEvent:
    """Inverse of :func:`event_to_dict`; only classes of ``dp_accounting.dp_event`` are built."""
    if not isinstance(data, Mapping) or "class_name" not in data:
        raise LedgerError(f"event must be an object with a class_name, got {data!r}")
    cls = getattr(dp_event, str(data["class_name"]), None)
    if not (isinstance(cls, type) and issubclass(cls, dp_event.DpEvent)):
        raise LedgerError(f"unknown dp_accounting event class {data['class_name']!r}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        if name == "class_name":
            continue
        if isinstance(value, Mapping) and "class_name" in value:
            value = event_from_dict(value)
        elif isinstance(value, list):
            value = [event_from_dict(v) if isinstance(v, Mapping) and "class_name" in v else v for v in value]
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise LedgerError(f"event {data['class_name']}: {exc}") from None


def event_to_json(event: dp_event.DpEvent) -> str:
    """Canonical JSON of an event (sorted keys): equal events give equal strings."""
    return json.dumps(event_to_dict(event), sort_keys=True, separators=(",", ":"))


def event_from_json(text: str) -> dp_event.DpEvent:
    return event_from_dict(json.loads(text))


# --------------------------------------------------------------------------- entries

def package_versions() -> dict[str, str]:
    """Versions that can change a recomputed eps (recorded on every line)."""
    out = {"python": platform.python_version()}
    for pkg in ("dp-accounting", "numpy", "scipy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "unknown"
    return out


@dataclass
class LedgerEntry:
    """One private mechanism execution and the eps claimed for it.

    ``noise_multiplier`` is noise std / sensitivity of the Gaussian at the core of the
    event (1/mu_bar_B for an EMPDEN block); ``count`` is how many times it was composed.
    """

    stage: str
    mechanism: str
    event: dict[str, Any]
    sensitivity: float
    noise_std: float
    sampling: dict[str, Any]
    adjacency: str
    count: int
    delta: float
    claimed_epsilon: float
    accountant: dict[str, Any]
    config_id: str
    seed: int
    noise_multiplier: float = float("nan")
    versions: dict[str, str] = field(default_factory=package_versions)
    time_utc: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    extra: dict[str, Any] = field(default_factory=dict)
    format: str = LEDGER_FORMAT
    #: the binding (:class:`Binding`), stamped by :func:`append_entry`; empty / -1 on a line not yet written
    run: str = ""
    experiment: str = ""
    data_sha256: str = ""
    seq: int = -1
    #: which of a run's releases by one stage the line is (DP-Promise's ``phase1`` / ``phase2``: the same stage twice
    #: on the same data); ``""`` for a stage that releases once per run. Part of the line's identity in the replay
    phase: str = ""

    def __post_init__(self) -> None:
        if math.isnan(self.noise_multiplier) and self.sensitivity > 0:
            self.noise_multiplier = self.noise_std / self.sensitivity
        self.validate()

    def validate(self) -> None:
        """Reject a line that could not be replayed or whose parts disagree."""
        where = f"ledger entry of stage {self.stage!r}"
        if self.format != LEDGER_FORMAT:
            raise LedgerError(f"{where}: format {self.format!r}, expected {LEDGER_FORMAT!r}")
        if self.accountant.get("name") not in CERTIFIED_ACCOUNTANTS:
            raise LedgerError(f"{where}: accountant {self.accountant.get('name')!r} is not a certified "
                              f"accountant ({', '.join(CERTIFIED_ACCOUNTANTS)}); estimates cannot be claimed")
        if self.sampling.get("scheme") not in SAMPLING_SCHEMES:
            raise LedgerError(f"{where}: sampling scheme {self.sampling.get('scheme')!r} not in {SAMPLING_SCHEMES}")
        if self.adjacency not in ADJACENCIES:
            raise LedgerError(f"{where}: adjacency {self.adjacency!r} not in {ADJACENCIES}")
        if not 0 < self.delta < 1:
            raise LedgerError(f"{where}: delta must be in (0, 1), got {self.delta}")
        if not (self.claimed_epsilon >= 0):
            raise LedgerError(f"{where}: claimed_epsilon must be >= 0, got {self.claimed_epsilon}")
        for name in ("run", "experiment", "data_sha256", "phase"):
            if not isinstance(getattr(self, name), str):
                raise LedgerError(f"{where}: {name} must be a string, got {getattr(self, name)!r}")
        if isinstance(self.seq, bool) or not isinstance(self.seq, int) or self.seq < -1:
            raise LedgerError(f"{where}: seq must be the line's position in its transcript (an integer >= 0; -1 before "
                              f"it is written), got {self.seq!r}")
        if self.sensitivity <= 0 or self.noise_std < 0:
            raise LedgerError(f"{where}: need sensitivity > 0 and noise_std >= 0")
        if not math.isclose(self.noise_multiplier, self.noise_std / self.sensitivity, rel_tol=1e-9):
            raise LedgerError(f"{where}: noise_multiplier {self.noise_multiplier} != noise_std/sensitivity "
                              f"{self.noise_std / self.sensitivity}")
        event = event_from_dict(self.event)  # raises on a malformed event
        core = core_noise_multipliers(event)
        if core and not any(math.isclose(self.noise_multiplier, nm, rel_tol=1e-9) for nm in core):
            raise LedgerError(f"{where}: noise_multiplier {self.noise_multiplier} matches no Gaussian in the event "
                              f"({sorted(set(core))[:5]})")

        probs = _sampling_probabilities(event)
        q = self.sampling.get("probability")
        if self.sampling["scheme"] != "none" and not any(math.isclose(float(q or -1), p, rel_tol=1e-9) for p in probs):
            raise LedgerError(f"{where}: sampling probability {q} matches no sampled event ({sorted(set(probs))[:5]})")
        if isinstance(event, dp_event.SelfComposedDpEvent) and event.count != self.count:
            raise LedgerError(f"{where}: count {self.count} != the event's composition count {event.count}")

    def dp_event(self) -> dp_event.DpEvent:
        return event_from_dict(self.event)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LedgerEntry:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise LedgerError(f"unknown ledger field {unknown[0]!r}")
        try:
            return cls(**dict(data))
        except TypeError as exc:
            raise LedgerError(str(exc)) from None


def core_noise_multipliers(event: dp_event.DpEvent) -> list[float]:
    if isinstance(event, dp_event.GaussianDpEvent):
        return [float(event.noise_multiplier)]
    inner = getattr(event, "event", None)
    if isinstance(inner, dp_event.DpEvent):
        return core_noise_multipliers(inner)
    out: list[float] = []
    for e in getattr(event, "events", []) or []:
        out += core_noise_multipliers(e)
    return out


def _sampling_probabilities(event: dp_event.DpEvent) -> list[float]:
    out: list[float] = []
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        out.append(float(event.sampling_probability))
    if isinstance(event, (dp_event.SampledWithoutReplacementDpEvent, dp_event.SampledWithReplacementDpEvent)):
        out.append(event.sample_size / event.source_dataset_size)
    inner = getattr(event, "event", None)
    if isinstance(inner, dp_event.DpEvent):
        out += _sampling_probabilities(inner)
    for e in getattr(event, "events", []) or []:
        out += _sampling_probabilities(e)
    return out


@dataclass(frozen=True)
class Binding:
    """Where a transcript's lines belong: the ``run`` the stage was run for (the name its method registers
    the transcript under), the ``experiment``, and the sha256 of the private split the mechanism read
    (its manifest's; ``""`` only for configuration claims, which read no data)."""

    run: str
    experiment: str
    data_sha256: str
    #: which of the run's releases by this stage (:attr:`LedgerEntry.phase`; ``""``: the stage releases once)
    phase: str = ""


#: the stage param that carries the binding: ``{"run": ..., "experiment": ...}`` (rules/common.smk ledger_binding)
BINDING_PARAM = "ledger_binding"
BINDING_DOC = ("{run, experiment[, phase]} the stage's ledger lines are bound to (the replay checks them against the "
               "registry)")


def binding_of(params: Mapping[str, Any], *, data_sha256: str, stage: str) -> Binding:
    """The :class:`Binding` of a stage's lines from its ``ledger_binding`` param and the split it read."""
    given = params.get(BINDING_PARAM)
    if not isinstance(given, Mapping):
        raise BindingError(f"stage {stage}: param {BINDING_PARAM} = {{run, experiment}} is required (a ledger line "
                           f"must name the run and experiment it belongs to)")
    for key in ("run", "experiment"):
        if not isinstance(given.get(key), str) or not given[key]:
            raise BindingError(f"stage {stage}: param {BINDING_PARAM}.{key} must be a non-empty string, "
                               f"got {given.get(key)!r}")
    phase = given.get("phase", "")
    if not isinstance(phase, str):
        raise BindingError(f"stage {stage}: param {BINDING_PARAM}.phase must be a string, got {phase!r}")
    return Binding(run=given["run"], experiment=given["experiment"], data_sha256=str(data_sha256), phase=phase)


def _n_lines(path: Path) -> int:
    if not path.is_file():
        return 0
    with path.open("rb") as fh:
        return sum(1 for _ in fh)


def append_entry(path: str | Path, entry: LedgerEntry, binding: Binding | None = None, *,
                 first_seq: int = 0) -> LedgerEntry:
    """Append one line to the JSONL transcript and fsync it; returns the line as written.

    With ``binding`` the line is stamped with it and with its position ``seq`` in the transcript (the
    number of lines already there, after ``first_seq`` lines another job writes: a shard's transcript is a part
    of its run's, pipeline.shards): every line a stage writes is bound. One ``write`` of a line shorter
    than the pipe buffer under ``O_APPEND`` lands whole even with concurrent writers; fsync makes it
    survive a crash of the stage that follows.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if binding is not None:
        entry = dataclasses.replace(entry, run=binding.run, experiment=binding.experiment,
                                    data_sha256=binding.data_sha256, phase=binding.phase,
                                    seq=first_seq + _n_lines(path))
    line = (entry.to_json() + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # the umask applies, as for every output
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    return entry


def read_ledger(path: str | Path) -> Iterator[tuple[int, LedgerEntry]]:
    """Yield (line number, entry) of a transcript; a bad line raises naming file:line.

    :func:`append_entry` writes whole newline-terminated lines only, so a blank line or a last
    line without its newline means the transcript was cut or edited: both are refused rather
    than skipped, since a claim lost that way would otherwise go unnoticed.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: ledger transcript not found (run the stage that writes it)")
    with path.open() as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.endswith("\n"):
                raise LedgerError(f"{path}:{lineno}: truncated transcript (the last line has no newline; "
                                  f"a write was cut off)")
            if not line.strip():
                raise LedgerError(f"{path}:{lineno}: blank line (a transcript holds one JSON entry per line)")
            try:
                yield lineno, LedgerEntry.from_dict(json.loads(line))
            except (json.JSONDecodeError, LedgerError) as exc:
                msg = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
                raise LedgerError(f"{path}:{lineno}: {msg}") from None


def only_line(path: str | Path, mechanism: str) -> LedgerEntry:
    """The one ``mechanism`` line of a run's own transcript ``path`` (a missing file, a bad line, a
    second line or another mechanism is a :class:`LedgerError` naming the file)."""
    try:
        lines = [entry for _, entry in read_ledger(path)]
    except FileNotFoundError:
        raise LedgerError(f"{path}: transcript not found (expected the one {mechanism} line)") from None
    except LedgerError as exc:
        raise LedgerError(f"{path}: {exc}") from None
    if len(lines) != 1 or lines[0].mechanism != mechanism:
        raise LedgerError(f"{path}: expected the one {mechanism} line, found {[e.mechanism for e in lines]}")
    return lines[0]
