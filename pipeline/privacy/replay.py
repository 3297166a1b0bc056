"""Replay: recompute every claimed eps from the ledger transcripts alone (SPEC, Accounting).

For each line the serialised ``dp_accounting`` event is fed to a fresh accountant of the
kind the line names, with the settings it records (PLD discretisation and truncation, RDP
orders), and the recomputed certified eps is compared with the claim. A claim smaller than
the recomputed value (beyond floating-point noise) fails the stage loudly: the rule
``replay`` is part of ``all``, so a ledger that overstates privacy stops the workflow.
Lines whose fields disagree with their own event (e.g. a noise multiplier edited without
the event) are refused when read (:class:`pipeline.privacy.ledger.LedgerError`).

Before its eps is recomputed, every line's event is rebuilt from the mechanism parameters on
the same line (:mod:`pipeline.privacy.rebuild`): an event edited to claim less (mu_bar_B and
q halved while the line still says B and n) or a mechanism nobody can rebuild fails. And the
transcripts themselves must be whole: each private stage that ran must hand in its transcript
(``expected``), and an empty, truncated or short transcript fails, since a missing
claim is not an audit pass.

Every line is also bound to where it belongs (:class:`Registered`, from the method's registration):
its run, experiment, stage, the configured delta of its method, the sha256 of the private split
the mechanism read and its position in the transcript must be the registered ones, and no line may
be handed in twice. A mu_bar_B "given directly" (``extra.source = "given"``) is allowed only on
the accounting tables' configuration claims. A line's PLD settings may be no looser than the
project's own (:data:`MAX_DISCRETISATION`, :data:`MAX_LOG_MASS_TRUNCATION`), and any line whose
recomputed eps does not cover its claim fails, an infinite one included. The stage certifies
nothing without the registry's expectations (``params.expected``): called from the command line
without them it refuses, so a deleted line cannot pass as a shorter transcript.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.io import manifest_path, read_json, write_json
from pipeline.privacy import accountants as acc
from dp_accounting import dp_event

from pipeline.privacy import certify, ledger, rebuild
# one certified eps per distinct (event, accountant, delta), memoised per process and shared with the result tables
# and the bundles (a bundle's export replays its lines, then certifies their composition: one PLD, not two)
from pipeline.privacy.certify import recompute, recompute_cached  # noqa: F401 (recompute: the uncached one, as before)
from pipeline.stage import PipelineError, stage

log = logging.getLogger(__name__)

#: relative slack for floating-point differences between library versions; any real
#: understatement of eps is many orders of magnitude larger.
REL_TOL = 1e-6
#: the coarsest PLD grid any stage of the project certifies with (EMPDEN's accounting.discretisation at
#: its schema maximum; the mechanisms use 1e-4 or 1e-5). The pessimistic PLD stays an upper bound on a
#: coarser grid, but a line is held to the project's own settings, so a claim is never replayed under
#: settings nobody chose for it.
MAX_DISCRETISATION = 1e-3
#: the largest tail mass (ln) the PLD may truncate: the project's (EMPDEN App. G's e^-50). A line with
#: -10 recomputes to +inf and must not pass as "not covered, but finite-less".
MAX_LOG_MASS_TRUNCATION = acc.PAPER_LOG_MASS_TRUNCATION


class ReplayError(PipelineError):
    """A claim the transcripts cannot back: understated, rebuilt differently, missing, cut off or unbound."""


@dataclass(frozen=True)
class Registered:
    """What a transcript must be (the method's registration, :class:`pipeline.registry.TranscriptSpec`).

    ``claims`` alone checks the count (a programmatic audit of lines written without a binding); the rest,
    when given, is checked on every line: ``run``, ``experiment``, ``stage``, ``delta`` (the method's
    configured one), ``data_sha256`` (the manifest sha256 of the split its stage read; ``""`` for
    configuration claims) and ``seq`` = the line's position, ``phase``, the manifest's size ``data_n``, and
    each line's configured ``params`` and calibration target (``epsilon_target``, composed ``after`` other
    transcripts and after the earlier lines ``prior_lines`` of its own, to ``rtol``). Only ``configuration``
    transcripts may hold a mu_bar_B given directly.
    """

    claims: int
    run: str | None = None
    experiment: str | None = None
    stage: str | None = None
    delta: float | None = None
    data_sha256: str | None = None
    configuration: bool = False
    #: the split manifest's record count N (None: configuration claims, which read no split)
    data_n: int | None = None
    phase: str = ""
    #: per line: the configured mechanism parameters (dotted line path -> value) and the calibration target
    params: tuple[Mapping[str, Any], ...] = ()
    epsilon_target: tuple[float | None, ...] = ()
    #: names of the transcripts a calibration composed before this one, and the calibration's tolerance
    after: tuple[str, ...] = ()
    rtol: float = 1e-3
    #: per line: the indices of earlier lines of this transcript its calibration composed before it
    prior_lines: tuple[tuple[int, ...], ...] = ()

    @property
    def bound(self) -> bool:
        return self.run is not None


def _count(name: str, count: Any) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        # a private stage that ran made at least one claim: zero expected is a config error
        raise PipelineError(f"replay: params.expected.{name}.claims must be an integer >= 1, got {count!r}")
    return count


def _manifest(name: str, data: Any) -> tuple[str, int | None]:
    """The sha256 and record count N the manifest of the split file ``data`` records (('', None) for none);
    a one-line error when either is missing: a line's declared N is held to it."""
    if data is None:
        return "", None
    try:
        manifest = read_json(manifest_path(str(data)))
        sha, n = str(manifest["sha256"]), manifest["n"]
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise ReplayError(f"replay: params.expected.{name}.data: {data} has no readable manifest sha256 and n "
                          f"({exc!r})") from None
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ReplayError(f"replay: params.expected.{name}.data: {data}'s manifest n must be an integer >= 1, "
                          f"got {n!r}")
    return sha, n


def _per_line(name: str, key: str, value: Any, claims: int) -> tuple[Any, ...]:
    if not isinstance(value, list) or len(value) != claims:
        raise PipelineError(f"replay: params.expected.{name}.{key} must list one item per claim ({claims}), "
                            f"got {value!r}")
    return tuple(value)


def registered_from_params(expected: Any, experiment: Any) -> dict[str, Registered]:
    """``params.expected`` (name -> {claims, run, stage, delta, data, configuration}) and ``params.experiment``
    checked and read into :class:`Registered`; without them the stage certifies nothing."""
    if expected is None:
        raise PipelineError("replay: params.expected is required: every transcript's registered claims, run, stage, "
                            "delta and data (the workflow's rule replay passes the method registry's); without it "
                            "a transcript short of a line could not be told from a whole one, so nothing is certified")
    if not isinstance(expected, Mapping):
        raise PipelineError(f"replay: params.expected must be a mapping of transcript name to its registration, "
                            f"got {expected!r}")
    if not isinstance(experiment, str) or not experiment:
        raise PipelineError(f"replay: params.experiment must be the experiment's name, got {experiment!r}")
    out = {}
    for name, spec in expected.items():
        keys = ("claims", "run", "stage", "delta", "data", "configuration", "params", "epsilon_target", "after",
                "rtol", "phase", "prior_lines")
        if not isinstance(spec, Mapping) or set(spec) != set(keys):
            raise PipelineError(f"replay: params.expected.{name} must hold exactly {', '.join(keys)}, got {spec!r}")
        delta = spec["delta"]
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
            raise PipelineError(f"replay: params.expected.{name}.delta must be in (0, 1), got {delta!r}")
        claims = _count(name, spec["claims"])
        params = _per_line(name, "params", spec["params"], claims)
        if not all(isinstance(p, Mapping) and p for p in params):
            raise PipelineError(f"replay: params.expected.{name}.params: every line needs its configured mechanism "
                                f"parameters (dotted line path -> value), got {spec['params']!r}")
        targets = _per_line(name, "epsilon_target", spec["epsilon_target"], claims)
        if not all(t is None or (isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0) for t in targets):
            raise PipelineError(f"replay: params.expected.{name}.epsilon_target must be > 0 or null per line, "
                                f"got {targets!r}")
        priors = _per_line(name, "prior_lines", spec["prior_lines"], claims)
        if not all(isinstance(p, list) and all(isinstance(j, int) and not isinstance(j, bool) and 0 <= j < i
                                                for j in p) for i, p in enumerate(priors)):
            raise PipelineError(f"replay: params.expected.{name}.prior_lines must list earlier line indices per line, "
                                f"got {priors!r}")
        sha, n = _manifest(name, spec["data"])
        out[str(name)] = Registered(claims=claims, run=str(spec["run"]), experiment=experiment,
                                    stage=str(spec["stage"]), delta=float(delta), data_sha256=sha, data_n=n,
                                    configuration=bool(spec["configuration"]), phase=str(spec["phase"]),
                                    params=params, epsilon_target=targets,
                                    after=tuple(Path(a).stem for a in spec["after"]), rtol=float(spec["rtol"]),
                                    prior_lines=tuple(tuple(p) for p in priors))
    return out


def settings_failures(entry: ledger.LedgerEntry) -> list[str]:
    """The ways the line's accountant settings are looser than the project's own or unusable (empty if none)."""
    if entry.accountant.get("name") == "rdp":
        orders = entry.accountant.get("orders")
        if orders is not None and not (isinstance(orders, list) and orders and all(
                isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a) and a > 1
                for a in orders)):
            return [f"RDP orders {orders!r} are not a non-empty list of finite orders > 1 (null: dp_accounting's)"]
        return []
    if entry.accountant.get("name") != "pld_pessimistic":
        return []
    out = []
    h = entry.accountant.get("value_discretization_interval", acc.PAPER_DISCRETISATION)
    t = entry.accountant.get("log_mass_truncation_bound", acc.PAPER_LOG_MASS_TRUNCATION)
    if not (isinstance(h, (int, float)) and 0 < h <= MAX_DISCRETISATION):
        out.append(f"PLD discretisation {h!r} is looser than the project's (at most {MAX_DISCRETISATION:g})")
    if not (isinstance(t, (int, float)) and math.isfinite(t) and t <= MAX_LOG_MASS_TRUNCATION):
        out.append(f"PLD log mass truncation bound {t!r} is looser than the project's (at most "
                   f"{MAX_LOG_MASS_TRUNCATION:g})")
    return out


def binding_failures(entry: ledger.LedgerEntry, index: int, reg: Registered) -> list[str]:
    """The ways the line is not where its registration says it belongs (empty if none)."""
    out = []
    if entry.extra.get("source") == "given" and not reg.configuration:
        out.append("carries a mu_bar_B given directly (extra.source = 'given'), which only the accounting tables' "
                   "configuration claims may; a mechanism's line is rebuilt from the parameters it ran with")
    if not reg.bound:
        return out
    for name, want in (("run", reg.run), ("experiment", reg.experiment), ("stage", reg.stage),
                       ("phase", reg.phase), ("data_sha256", reg.data_sha256)):
        got = getattr(entry, name)
        if got != want:
            out.append(f"{name} is {got!r}, the transcript is registered for {want!r}")
    if entry.delta != reg.delta:
        out.append(f"delta is {entry.delta:g}, the method's configured delta is {reg.delta:g}")
    if entry.seq != index:
        out.append(f"seq is {entry.seq}, it is line {index + 1} of its transcript (seq {index}): a line was moved, "
                   f"deleted or repeated")
    return out + configured_failures(entry, index, reg)


def configured_failures(entry: ledger.LedgerEntry, index: int, reg: Registered) -> list[str]:
    """The ways the line's mechanism parameters differ from what the configuration ran (empty if none): every
    registered parameter of its line, and the private set's size N against the split's manifest."""
    out = []
    if index < len(reg.params):
        for path, want in reg.params[index].items():
            got = rebuild.lookup(entry, path)
            if got is rebuild.MISSING:
                out.append(f"{path} is missing from the line; the configuration ran {want!r}")
            elif rebuild.differences(got, want, path):
                out.append(f"{path} is {got!r}, the configuration ran {want!r}")
    size = rebuild.size_field(entry.mechanism)
    if size is not None and reg.data_n is not None:
        got = rebuild.lookup(entry, size)
        if got is rebuild.MISSING or not rebuild.same(got, reg.data_n):
            out.append(f"{size} (the private set's size N) is {None if got is rebuild.MISSING else got!r}, the split "
                       f"it read holds {reg.data_n} records (its manifest)")
    return out


def calibration_failures(entry: ledger.LedgerEntry, target: float, prior: Sequence[ledger.LedgerEntry],
                         rtol: float) -> list[str]:
    """Whether a line calibrated to ``target`` carries the calibrated noise (empty if so).

    Every calibration here (:func:`pipeline.privacy.accountants.bisect_log_sigma`) returns the smallest noise, to
    ``rtol``, whose certified eps -- composed after the run's earlier releases ``prior``, as the calibration
    composed them -- meets the target, with the project's PLD (or the line's RDP). So the line's noise divided by
    ``(1 + rtol)^2`` must exceed the target: a line that says it ran with more noise than the calibration gives
    (sigma doubled, or a phase's line copied into another's place) spends less than its target and is refused.
    """
    event = entry.dp_event()
    if not certify.has_gaussian(event):
        return [f"is registered as calibrated to eps {target:g}, but its event has no Gaussian noise to check"]
    probe = certify.scale_noise(event, 1.0 / (1.0 + rtol) ** 2)
    if prior:
        probe = dp_event.ComposedDpEvent([*(e.dp_event() for e in prior), probe])
    try:
        eps = certify.epsilon_of(probe, entry.accountant, entry.delta, reference=False)
    except (acc.AccountingError, ValueError) as exc:
        return [f"cannot check its calibration to eps {target:g} ({exc})"]
    if eps > target:
        return []
    with_prior = f" composed after {len(prior)} earlier release(s)" if prior else ""
    return [f"its noise is not the calibration's: {(1 + rtol) ** 2 - 1:.2%} less noise{with_prior} would still "
            f"meet the target eps {target:g} the configuration calibrated it to (eps {eps:.6g}); the line says more "
            f"noise than the mechanism ran"]


def replay_line(path: Path, lineno: int, entry: ledger.LedgerEntry, failures: list[str],
                reg: Registered | None = None) -> dict[str, Any]:
    """Rebuild the line's event from its parameters, check its settings and binding, recompute its eps; append
    each problem to ``failures``."""
    where = f"{path}:{lineno}"
    loose = settings_failures(entry)
    problems = loose + binding_failures(entry, lineno - 1, reg or Registered(claims=1))
    failures.extend(f"{where}: {p}" for p in problems)
    try:
        rebuild.check(entry)
        rebuilt = True
    except rebuild.RebuildError as exc:
        failures.append(f"{where}: {exc}")
        rebuilt = False
    try:
        # a line held to settings the project does not use is not recomputed under them: nothing certifies it
        eps = math.inf if loose else recompute_cached(entry)
    except (acc.AccountingError, ValueError) as exc:
        # e.g. noise switched off, or settings dp_accounting refuses: nothing certifies such a line
        failures.append(f"{where}: cannot certify ({exc})")
        eps = math.inf
    covered = entry.claimed_epsilon >= eps * (1 - REL_TOL)
    if not covered:
        # an infinite recomputed eps is the worst case, not an exemption
        failures.append(f"{where}: claimed eps {entry.claimed_epsilon:.6g} < recomputed certified "
                        f"eps {eps:.6g} ({entry.accountant['name']}, delta={entry.delta:g})")
    return {"transcript": str(path), "line": lineno, "stage": entry.stage, "mechanism": entry.mechanism,
            "accountant": entry.accountant["name"], "delta": entry.delta, "claimed_epsilon": entry.claimed_epsilon,
            "recomputed_epsilon": eps if math.isfinite(eps) else None, "event_rebuilt": rebuilt,
            "run": entry.run, "seq": entry.seq, "ok": covered and rebuilt and not problems}


def identity(entry: ledger.LedgerEntry) -> tuple[str, str, str, str, int]:
    """What makes a line one release and no other: (run, experiment, stage, phase, seq). Two lines handed in with
    one identity are one release counted twice, or a copy in another's place, whatever else differs on them."""
    return entry.run, entry.experiment, entry.stage, entry.phase, entry.seq


def _replay_transcript(name: str, path: Path, reg: Registered | None, failures: list[str],
                       seen: dict[Any, str]) -> tuple[list[dict[str, Any]], dict[str, Any], list[ledger.LedgerEntry]]:
    """The claims of one transcript, its summary and its lines; a missing, cut, empty, short or repeated one is a
    failure."""
    try:
        lines = list(ledger.read_ledger(path))
    except FileNotFoundError:
        failures.append(f"{path}: transcript {name!r} not found (the private stage that writes it did not run)")
        lines = None
    except ledger.LedgerError as exc:
        failures.append(str(exc))
        lines = None
    claims = []
    for n, e in lines or []:
        # an unbound line (a programmatic audit) has no identity yet: its text is its identity
        key = identity(e) if e.seq >= 0 else e.to_json()
        if key in seen:
            why = (f"one release: run, experiment, stage, phase, seq = {key}; a line handed in twice, or copied "
                   f"into another's place, certifies nothing" if e.seq >= 0 else
                   "a line handed in twice certifies nothing new")
            failures.append(f"{path}:{n}: the same line as {seen[key]} ({why})")
        seen.setdefault(key, f"{path}:{n}")
        claims.append(replay_line(path, n, e, failures, reg))
    whole = lines is not None
    expected = None if reg is None else reg.claims
    if whole and not claims:
        failures.append(f"{path}: empty transcript (0 claims): a private stage without its claims is not an audit pass")
        whole = False
    elif whole and expected is not None and len(claims) != expected:
        failures.append(f"{path}: {len(claims)} claim(s), expected {expected} (a claim is missing or extra)")
        whole = False
    summary = {"name": name, "transcript": str(path), "n_claims": len(claims), "expected_claims": expected,
               "run": None if reg is None else reg.run, "ok": whole and all(c["ok"] for c in claims)}
    return claims, summary, [e for _, e in lines or []]


def _check_calibrations(regs: Mapping[str, Registered], lines: Mapping[str, list[ledger.LedgerEntry]],
                        transcripts: Mapping[str, Path], results: list[dict[str, Any]], failures: list[str]) -> None:
    """:func:`calibration_failures` of every calibrated line of every handed-in transcript; a failed line's result
    is marked not ok."""
    by_line = {(r["transcript"], r["line"]): r for r in results}
    for name, reg in regs.items():
        if name not in lines:
            continue
        missing = [a for a in reg.after if a not in lines]
        earlier = [e for a in reg.after if a in lines for e in lines[a]]
        for i, entry in enumerate(lines[name]):
            target = reg.epsilon_target[i] if i < len(reg.epsilon_target) else None
            if target is None:
                continue
            own = reg.prior_lines[i] if i < len(reg.prior_lines) else ()
            prior = [*earlier, *(lines[name][j] for j in own if j < len(lines[name]))]
            where = f"{transcripts[name]}:{i + 1}"
            problems = ([f"its calibration composed transcript(s) {', '.join(missing)} before it, not handed in"]
                        if missing else calibration_failures(entry, target, prior, reg.rtol))
            failures.extend(f"{where}: {p}" for p in problems)
            if problems and (str(transcripts[name]), i + 1) in by_line:
                by_line[(str(transcripts[name]), i + 1)]["ok"] = False


def audit(transcripts: Mapping[str, Path], expected: Mapping[str, int | Registered] | None = None
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Replay every line of every named transcript; raise :class:`ReplayError` on any failure.

    ``expected`` (name -> :class:`Registered`, or a bare claim count) names the private stages that ran
    and what each wrote: a listed transcript not handed in, or one handed in but not listed, fails.
    Whatever is given, a transcript that is missing, truncated, empty or short of its count fails, as
    does a line whose event differs from its parameters' rebuild, whose claim is not covered by the
    recomputed eps, whose settings are looser than the project's, that repeats another line's identity, that is
    not bound to its registration, whose parameters are not the configured ones, or whose noise is not its
    calibration's. Returns (one result per claim, one summary per transcript).
    """
    failures: list[str] = []
    regs = {k: v if isinstance(v, Registered) else Registered(claims=v) for k, v in (expected or {}).items()}
    if expected is not None:
        for name in sorted(set(regs) - set(transcripts)):
            failures.append(f"transcript {name!r} of a private stage that ran was not handed in "
                            f"(expected {regs[name].claims} claim(s))")
        for name in sorted(set(transcripts) - set(regs)):
            failures.append(f"transcript {name!r} ({transcripts[name]}) is not in the expected transcripts")
    elif not transcripts:
        failures.append("no ledger transcripts given: pass --in NAME=PATH for every private stage that ran, or "
                        "params.expected = {} to state that none did")
    results, summaries = [], []
    seen: dict[Any, str] = {}
    lines: dict[str, list[ledger.LedgerEntry]] = {}
    for name, path in transcripts.items():
        claims, summary, lines[name] = _replay_transcript(name, Path(path), regs.get(name), failures, seen)
        results += claims
        summaries.append(summary)
    _check_calibrations(regs, lines, {k: Path(p) for k, p in transcripts.items()}, results, failures)
    if failures:
        for f in failures:
            log.error(f)
        more = f" (+{len(failures) - 1} more, see the log)" if len(failures) > 1 else ""
        raise ReplayError(f"replay FAILED: {failures[0]}{more}")
    return results, summaries


def replay_transcripts(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """:func:`audit` of ``paths`` (each must hold at least one claim); the per-claim results."""
    return audit({str(p): Path(p) for p in paths})[0]


@stage("replay", outputs=("report",), any_inputs=True,
       params={"config_id": "id of the configuration (recorded in the report)",
               "experiment": "the experiment every line must name",
               "expected": "transcript name -> {claims, run, stage, delta, data, configuration, params, "
                           "epsilon_target, after, rtol, phase, prior_lines}: the method "
                           "registry's (pipeline.registry.TranscriptSpec); every --in must be listed and every listed "
                           "name given. Required: without it the stage certifies nothing"})
def replay(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Recompute every ledger claim (--in NAME=transcript.jsonl ...); fail on any uncovered, rebuilt-differently,
    missing, empty, truncated, repeated, unbound or not-as-configured claim."""
    regs = registered_from_params(params.get("expected"), params.get("experiment"))
    results, transcripts = audit({k: Path(p) for k, p in inputs.items()}, regs)
    write_json(outputs["report"], {"format": "dpgen-replay/3", "config_id": params.get("config_id"),
                                   "experiment": params.get("experiment"),
                                   "transcripts": transcripts, "n_transcripts": len(transcripts),
                                   "n_claims": len(results), "all_ok": True,
                                   "versions": ledger.package_versions(), "claims": results})
