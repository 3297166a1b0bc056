"""Where each method's rule file registers its outputs: the targets of ``rule all`` and the index
page, the ledger transcripts the replay reads, the rows of all_runs and the certified bundles.

``rules/common.smk`` holds one :class:`MethodRegistry`; ``rules/<method>.smk`` builds its method's wiring
(``pipeline/methods/<method>/wiring.py``, a :class:`MethodWiring`) and registers it with one call,
``register(WIRING)``: the registry reads what the wiring gives (its targets, and where it has them its transcripts,
its evaluated runs and its bundles) and names the method by the wiring's package. The core rules (``rule all``,
``index_html``, ``replay``, ``all_runs_table``, the bundles) ask the registry for the methods the config's
``methods`` list chooses, in that list's order. So a new method adds its rule file and edits no central list.
Registrations are functions, called only when their method is chosen: a method left out of
``methods`` never computes its targets, and a rule file may register before the config values
it reads are used. Pure Python (no Snakemake): tested in ``tests/test_registry.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

#: what a method registers: a function returning its paths (or path -> TranscriptSpec for transcripts)
TargetsFn = Callable[[], Iterable[str | PathLike[str]]]
TranscriptsFn = Callable[[], Mapping[str | PathLike[str], "TranscriptSpec"]]
#: what a method registers for all_runs.parquet: one record per (configuration, seed) it ran
RunsFn = Callable[[], Iterable["RunRecord"]]
#: what a method registers for its certified bundles: the names of its private runs (no checkpoint read), and the
#: bundle of one of them (read when its job is planned: a run's chosen sampler may come from a checkpoint)
BundleRunsFn = Callable[[], Iterable[str]]
BundleFn = Callable[[str], "BundleSpec"]

#: the suffixes the index page shows: tables and figures (a figure's PDF is written beside its PNG)
REPORT_SUFFIXES = (".parquet", ".png")


#: one ledger line's configured mechanism parameters: a dotted path into the line (``sampling.n``, ``count``,
#: ``extra.max_grad_norm``) -> the value the configuration gives it
LineParams = Mapping[str, Any]


@dataclass(frozen=True)
class TranscriptSpec:
    """What one ledger transcript must be, as its method registers it: what the replay checks it against.

    ``claims``: the number of lines its stage writes; ``run``: the run (or table job) the stage was run
    for, the ``ledger_binding`` run its rule passes, on every line; ``stage``: the stage every line names;
    ``delta``: the method's configured delta, every line's; ``data``: the private split file the stage
    reads, whose manifest sha256 every line carries and whose size N the line's declared N must equal (``None``
    only for ``configuration`` claims, which read no data and alone may carry a mu_bar_B given directly,
    ``extra.source = "given"``); ``phase``: which of the run's releases by this stage it is (DP-Promise's two
    phases of one training stage), part of every line's identity.

    What the configuration says ran, from the same wiring that planned the run: ``params``, each line's
    configured mechanism parameters (:data:`LineParams`; one mapping for every line, or one per line), and
    ``epsilon_target``, the eps each line's noise was calibrated to (one for every line or one per line; ``None``:
    its noise is configured, and so in ``params``). A calibrated line's noise must be the calibration's: noise
    smaller by ``(1 + rtol)^2`` must exceed the target (composed after the lines of the transcripts ``after``, the
    run's earlier releases its calibration composed in, and after the earlier lines of its own transcript that
    ``prior_lines`` lists for it: the toy's DP-SGD after its point's release), so a line claiming more noise than
    ran is refused.
    """

    claims: int
    run: str
    stage: str
    delta: float
    data: str | None = None
    configuration: bool = False
    params: LineParams | Sequence[LineParams] = ()
    epsilon_target: float | None | Sequence[float | None] = None
    after: tuple[str, ...] = ()
    rtol: float = 1e-3
    phase: str = ""
    prior_lines: Sequence[Sequence[int]] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", None if self.data is None else str(self.data))
        if isinstance(self.claims, bool) or not isinstance(self.claims, int) or self.claims < 1:
            raise ValueError(f"transcript of run {self.run!r}: claims must be an integer >= 1, got {self.claims!r}")
        if (self.data is None) != self.configuration:
            raise ValueError(f"transcript of run {self.run!r}: a mechanism's transcript names the private split it "
                             f"read (data), configuration claims read none")
        object.__setattr__(self, "params", self._per_line("params", self.params, Mapping))
        if any(not p for p in self.params):
            raise ValueError(f"transcript of run {self.run!r}: every line needs its configured mechanism parameters "
                             f"(params: dotted line path -> value), so the replay can hold it to the configuration")
        object.__setattr__(self, "params", tuple({str(k): v for k, v in p.items()} for p in self.params))
        targets = self._per_line("epsilon_target", self.epsilon_target, (int, float, type(None)))
        if any(t is not None and (isinstance(t, bool) or not t > 0) for t in targets):
            raise ValueError(f"transcript of run {self.run!r}: epsilon_target must be > 0 or None, got {targets!r}")
        object.__setattr__(self, "epsilon_target", tuple(None if t is None else float(t) for t in targets))
        object.__setattr__(self, "after", tuple(str(p) for p in self.after))
        priors = tuple(tuple(int(j) for j in p) for p in self.prior_lines) or ((),) * self.claims
        if len(priors) != self.claims or any(not 0 <= j < i for i, p in enumerate(priors) for j in p):
            raise ValueError(f"transcript of run {self.run!r}: prior_lines must list, for each of the {self.claims} "
                             f"lines, earlier lines of the transcript, got {self.prior_lines!r}")
        object.__setattr__(self, "prior_lines", priors)
        if not 0 < self.rtol < 0.5:
            raise ValueError(f"transcript of run {self.run!r}: rtol must be in (0, 0.5), got {self.rtol!r}")

    def _per_line(self, name: str, value: Any, kind: type | tuple[type, ...]) -> tuple[Any, ...]:
        """``value`` as one item per line: a single item broadcast, or a sequence of exactly ``claims`` items."""
        if isinstance(value, kind):
            return (value,) * self.claims
        items = tuple(value)
        if len(items) != self.claims or not all(isinstance(v, kind) for v in items):
            raise ValueError(f"transcript of run {self.run!r}: {name} must be one value for every line or one per "
                             f"line ({self.claims}), got {value!r}")
        return items

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["params"], out["epsilon_target"], out["after"] = ([dict(p) for p in self.params],
                                                              list(self.epsilon_target), list(self.after))
        out["prior_lines"] = [list(p) for p in self.prior_lines]
        return out


@dataclass(frozen=True)
class RunRecord:
    """One row of all_runs.parquet: a method's (configuration, seed) that was evaluated.

    ``metrics``: its evaluate_samples JSON; ``ledgers``: the transcripts of every private mechanism
    that made it (composed for its certified eps; none for a public-only or non-private reference);
    ``private``: whether it claims DP (a private run without a transcript is refused);
    ``benchmarks``: Snakemake benchmark files of the jobs that produced it (its cost columns);
    ``label``: its line in the privacy-utility figure; ``in_figure``: whether it is drawn there
    (ablation rows and eps far off the common range stay in the table only); ``headline``: whether it is
    the method's main configuration, the row its paper reports (the summary page's one row per method is
    picked among these only, never from an ablation or a diagnostic row).
    """

    method: str
    config: str
    seed: int
    metrics: str
    epsilon_target: float | None = None
    private: bool = True
    ledgers: tuple[str, ...] = ()
    benchmarks: tuple[str, ...] = ()
    label: str = ""
    in_figure: bool = True
    headline: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "metrics", str(self.metrics))
        object.__setattr__(self, "ledgers", tuple(str(p) for p in self.ledgers))
        object.__setattr__(self, "benchmarks", tuple(str(p) for p in self.benchmarks))
        if self.private and not self.ledgers:
            raise ValueError(f"run {self.method}/{self.config}: a private run needs its ledger transcripts")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: what else a bundle's sampler may read beside its weights (rule export_bundle's inputs of these names)
BUNDLE_PARTS = ("moments", "public_flow", "autoencoder")


@dataclass(frozen=True)
class BundleSpec:
    """One private run's certified bundle (:mod:`pipeline.bundles`), as its method registers it.

    ``samples`` / ``metrics``: the run's synthetic set and its evaluate_samples JSON (the card's test-split
    metrics); ``transcripts``: the ledger transcripts that certify it (each registered by its wiring's
    ``transcripts()``);
    ``model``: its trained denoiser file, for a bundle of weights; ``parts``: the other files its sampler reads
    (:data:`BUNDLE_PARTS`: the released moments, the public flow, the public autoencoder); ``sampling``: how the run
    sampled from them (:mod:`pipeline.bundles.sample`), given exactly when a model or a part is (a bundle without
    either is a synthetic set: the synthetic set is the private output); ``covers`` / ``not_covered``: what its eps
    covers and what it does not.
    """

    run: str
    samples: str
    metrics: str
    transcripts: tuple[str, ...]
    epsilon_target: float | None = None
    model: str | None = None
    sampling: Mapping[str, Any] | None = None
    covers: tuple[str, ...] = ()
    not_covered: tuple[str, ...] = ()
    parts: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("samples", "metrics"):
            object.__setattr__(self, name, str(getattr(self, name)))
        object.__setattr__(self, "transcripts", tuple(str(p) for p in self.transcripts))
        if self.model is not None:
            object.__setattr__(self, "model", str(self.model))
        if not self.transcripts:
            raise ValueError(f"bundle of run {self.run!r}: a private run's bundle needs its ledger transcripts")
        unknown = sorted(set(self.parts) - set(BUNDLE_PARTS))
        if unknown:
            raise ValueError(f"bundle of run {self.run!r}: part {unknown[0]!r} is not one of {', '.join(BUNDLE_PARTS)}")
        object.__setattr__(self, "parts", {k: str(v) for k, v in self.parts.items()})
        if (self.model is None and not self.parts) != (self.sampling is None):
            raise ValueError(f"bundle of run {self.run!r}: a bundle of weights or parts says how it samples, a "
                             f"synthetic set does not")
        if "/" in self.run:
            raise ValueError(f"bundle of run {self.run!r}: a run name is one folder (no '/')")

    @property
    def kind(self) -> str:
        return "synthetic" if self.sampling is None else "model"


@runtime_checkable
class MethodWiring(Protocol):
    """What every method's wiring (``pipeline/methods/<method>/wiring.py``: ``Wiring``) gives the house: the outputs
    ``rule all`` builds for it and each of its rules' ``resources:``. A wiring that also has ``transcripts()`` (its
    ledger transcripts: path -> :class:`TranscriptSpec`), ``records()`` (its evaluated runs: :class:`RunRecord`) or
    ``bundle_runs()`` with ``bundle(run)`` (its certified bundles: :class:`BundleSpec`) has those registered too
    (:meth:`MethodRegistry.register`)."""

    def targets(self) -> Iterable[str | PathLike[str]]:
        """Its tables (.parquet) and figures (.png; PDF beside) for ``rule all`` and the index page."""
        ...

    def resources(self, rule: str) -> dict[str, Any]:
        """The whole ``resources:`` of its rule ``rule``: its request in its cost model (``costs.py``)."""
        ...


def method_of(wiring: object) -> str:
    """The method a wiring belongs to: the package ``pipeline.methods.<method>`` its class is defined in."""
    parts = type(wiring).__module__.split(".")
    if len(parts) < 3 or parts[:2] != ["pipeline", "methods"] or parts[2].startswith("_"):
        raise TypeError(f"{type(wiring).__qualname__} ({type(wiring).__module__}) is no method's wiring: a method's "
                        f"wiring is the Wiring class of pipeline/methods/<method>/wiring.py")
    return parts[2]


class MethodRegistry:
    """Each method's targets, ledger transcripts and evaluated runs, as registered by its rule file."""

    def __init__(self) -> None:
        self._targets: dict[str, list[TargetsFn]] = {}
        self._transcripts: dict[str, list[TranscriptsFn]] = {}
        self._runs: dict[str, list[RunsFn]] = {}
        self._bundles: dict[str, tuple[BundleRunsFn, BundleFn]] = {}

    def register_targets(self, method: str, targets: TargetsFn) -> None:
        """``targets()`` lists the method's outputs in ``rule all``: its tables (.parquet) and figures
        (.png) also go on the index page."""
        self._targets.setdefault(method, []).append(targets)
        self._transcripts.setdefault(method, [])

    def register_transcripts(self, method: str, transcripts: TranscriptsFn) -> None:
        """``transcripts()`` maps each ledger transcript the method writes to its :class:`TranscriptSpec`
        (claims, run, stage, delta, data); the replay reads them all and checks every line against it."""
        self._transcripts.setdefault(method, []).append(transcripts)
        self._targets.setdefault(method, [])

    def register_runs(self, method: str, runs: RunsFn) -> None:
        """``runs()`` lists the method's evaluated (configuration, seed) records: the rows of all_runs.parquet."""
        self._runs.setdefault(method, []).append(runs)
        self._targets.setdefault(method, [])
        self._transcripts.setdefault(method, [])

    def register_bundles(self, method: str, runs: BundleRunsFn, bundle: BundleFn) -> None:
        """``runs()`` names the method's private runs that get a certified bundle, ``bundle(run)`` is its
        :class:`BundleSpec` (the files it is made of)."""
        self._bundles[method] = (runs, bundle)
        self._targets.setdefault(method, [])
        self._transcripts.setdefault(method, [])

    def register(self, wiring: MethodWiring, method: str | None = None) -> None:
        """Register everything ``wiring`` gives for its method (``method``, or the package its class is defined in):
        its targets, and those of its transcripts, evaluated runs and bundles it has. A rule file's one call."""
        if not isinstance(wiring, MethodWiring):
            raise TypeError(f"{type(wiring).__qualname__} is not a method's wiring: it needs targets() and "
                            f"resources(rule) (pipeline.registry.MethodWiring)")
        method = method or method_of(wiring)
        self.register_targets(method, wiring.targets)
        if callable(transcripts := getattr(wiring, "transcripts", None)):
            self.register_transcripts(method, transcripts)
        if callable(records := getattr(wiring, "records", None)):
            self.register_runs(method, records)
        bundle_runs, bundle = getattr(wiring, "bundle_runs", None), getattr(wiring, "bundle", None)
        if callable(bundle_runs) != callable(bundle):
            raise TypeError(f"{type(wiring).__qualname__}: a wiring with bundles has both bundle_runs() and "
                            f"bundle(run)")
        if callable(bundle_runs):
            self.register_bundles(method, bundle_runs, bundle)

    @property
    def methods(self) -> list[str]:
        """Every method some rule file registered, in registration order."""
        return list(self._targets)

    def check(self, methods: Sequence[str]) -> None:
        """Every chosen method is registered by some rule file, or one ValueError naming those that are not."""
        missing = [m for m in methods if m not in self._targets]
        if missing:
            raise ValueError(f"config error at methods: {', '.join(missing)} has no rule file registering it "
                             f"(registered: {', '.join(self.methods) or 'none'}); include rules/<method>.smk "
                             f"in the Snakefile")

    def targets(self, methods: Sequence[str]) -> list[Path]:
        """Every target of the chosen ``methods``, method by method in their order, none twice."""
        self.check(methods)
        out: dict[Path, None] = {}
        for method in methods:
            for fn in self._targets[method]:
                out.update((Path(p), None) for p in fn())
        return list(out)

    def report_targets(self, methods: Sequence[str]) -> list[Path]:
        """The tables and figures of the chosen ``methods``: what the index page shows."""
        return [p for p in self.targets(methods) if p.suffix in REPORT_SUFFIXES]

    def transcripts(self, methods: Sequence[str]) -> dict[Path, TranscriptSpec]:
        """Ledger transcript -> what it must hold (:class:`TranscriptSpec`), for the chosen ``methods`` in order."""
        self.check(methods)
        out: dict[Path, TranscriptSpec] = {}
        identities: dict[tuple[str, str, str], Path] = {}
        for method in methods:
            for fn in self._transcripts[method]:
                for path, spec in fn().items():
                    if not isinstance(spec, TranscriptSpec):
                        raise TypeError(f"method {method}: transcript {path} is registered with {spec!r}; register "
                                        f"a TranscriptSpec (claims, run, stage, delta, data, params) so the replay can "
                                        f"bind it")
                    # the replay tells lines apart by (run, experiment, stage, phase, seq): two transcripts of one
                    # identity would let one's line stand in for the other's
                    key = (spec.run, spec.stage, spec.phase)
                    if identities.setdefault(key, Path(path)) != Path(path):
                        raise ValueError(f"method {method}: transcripts {identities[key]} and {path} are both "
                                         f"registered as run {spec.run!r}, stage {spec.stage!r}, phase "
                                         f"{spec.phase!r}; give each release of a stage its own phase")
                    out[Path(path)] = spec
        return out

    def runs(self, methods: Sequence[str]) -> list[RunRecord]:
        """Every evaluated run of the chosen ``methods``, in their order; a metrics file listed twice is one run."""
        self.check(methods)
        out: dict[str, RunRecord] = {}
        for method in methods:
            for fn in self._runs.get(method, []):
                for run in fn():
                    out.setdefault(run.metrics, run)
        return list(out.values())

    def bundle_runs(self, methods: Sequence[str]) -> list[tuple[str, str]]:
        """(method, run) of every bundle of the chosen ``methods``, in their order."""
        self.check(methods)
        return [(m, str(run)) for m in methods if m in self._bundles for run in dict.fromkeys(self._bundles[m][0]())]

    def bundle(self, method: str, run: str) -> BundleSpec:
        """The bundle ``method`` registered for ``run``; a KeyError naming the method's bundles otherwise."""
        if method not in self._bundles:
            raise KeyError(f"method {method!r} registers no bundles (registered: {', '.join(self._bundles) or 'none'})")
        return self._bundles[method][1](run)
