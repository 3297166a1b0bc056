"""The one registry of the methods: what each method declares (:class:`Method`) and what the house derives from it.

A method is a folder ``pipeline/methods/<method>/`` whose ``__init__`` holds ``METHOD``, its :class:`Method`
declaration, and ``STAGES`` (stage name -> ``"module:attribute"``). The house reads them here and keeps no list of
methods: the CLI's stages and data-parallel stages, the inputs and config checks run before any job, the resumable
rules the plan segments, the random streams, the bundle samplers, the GPU-check workloads, the report's categories,
the audited methods. The declarations hold strings only and are imported by
module path (:func:`importlib.import_module`), not by an ``import`` statement: a method depends on the house, and the
house on the declarations' form alone, so the import graph keeps no cycle (tests/test_imports.py) and
``python -m pipeline --help`` stays fast.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any


def method_names() -> list[str]:
    """Every method module or package under ``pipeline/methods/`` (a leading underscore is not a method), sorted.

    The folder is listed, not imported, and this module imports nothing of the pipeline: the configuration's schema
    (:mod:`pipeline.config`), the rates and the seeds read the registry, and the methods' engines read them
    (tests/test_imports.py).
    """
    folder = resources.files("pipeline").joinpath("methods")
    return sorted(m.name for m in pkgutil.iter_modules([str(folder)]) if not m.name.startswith("_"))


#: where the methods are found: one package (or module) per method, listed by :func:`method_names`
PACKAGE = "pipeline.methods"

#: stage name -> "module:attribute"
Stages = dict[str, str]


@dataclass(frozen=True)
class Method:
    """What the house needs to know of one method: its one declaration (``METHOD`` in its ``__init__``). Every
    ``"module:attribute"`` names code in the method's own folder, imported only when the house reads it."""

    name: str
    #: its menu entry in Snakemake's report (the number orders the menu), given to every table and figure whose name
    #: starts with one of ``report_prefixes``
    report_category: str | None = None
    report_prefixes: tuple[str, ...] = ()
    #: the one-run canary audit (method ``audit``) reads its ledger transcripts
    audited: bool = False
    #: its place in the schema's default ``methods:`` list, and so in ``rule all`` and the index page of a
    #: configuration that lists none (lower first); None: it runs only where a configuration lists it
    position: int | None = None
    #: its stages that may run as N processes under ``python -m pipeline <stage> --nproc N`` (DP-SGD over
    #: :mod:`pipeline.distributed`: sampling and noise on rank 0, the released gradient one process's)
    data_parallel_stages: tuple[str, ...] = ()
    #: ``function(cfg) -> [(config key, check), ...]``: the inputs from outside the results tree its jobs read
    #: (datasets, weights), checked before any job when it is chosen (:mod:`pipeline.inputs`)
    input_checks: str | None = None
    #: its training rules that checkpoint and resume, so that over the cluster's time limit they run in segments
    #: (their requests ask for :func:`pipeline.resources.segment_runtime_min`; the plan reads these)
    resumable_rules: tuple[str, ...] = ()
    #: its random streams (a sequence of :class:`pipeline.seeds.Stream`), which :func:`pipeline.seeds.stream` finds
    streams: str | None = None
    #: (``sampling.json``'s ``sampler`` name, ``"module:function"``) of the samplers its model bundles name
    #: (:mod:`pipeline.bundles.sample`)
    bundle_samplers: tuple[tuple[str, str], ...] = ()
    #: (model file suffix, ``"module:function"``) of the model files its bundles ship that are not the house's
    #: denoiser files (``.pt``): ``function(model_file, out_dir) -> description`` writes one into a bundle's
    #: ``weights/`` with a JSON description holding its ``meta`` (:func:`pipeline.bundles.weights.export_weights`)
    bundle_exports: tuple[tuple[str, str], ...] = ()
    #: the workloads its cost models run at, which ``make gpu-check`` measures (:mod:`pipeline.rates`,
    #: :mod:`pipeline.gpu_check`)
    workloads: str | None = None
    #: ``function(cfg)``: its checks across sections of a whole, validated configuration (sizes that would fail
    #: inside a job), run before any job when it is chosen, raising :class:`pipeline.config.ConfigError` in one line
    config_checks: str | None = None
    #: ``function(config)``: edits its section of every validated configuration in place (chosen or not), e.g.
    #: dropping what a later file switched off
    prepare_config: str | None = None

    #: its name in the documentation: the docs nav's entry of its page ``docs/methods/<name>.md`` and its link on the
    #: methods index (both derived, :mod:`docs.hooks.generated_pages`); the method's name where it declares none
    title: str | None = None

    def __post_init__(self) -> None:
        if self.report_prefixes and self.report_category is None:
            raise ValueError(f"method {self.name!r}: report_prefixes need a report_category")


def method_stages() -> dict[str, Stages]:
    """Method -> the stages it registers, from each module's ``STAGES``."""
    return {name: dict(importlib.import_module(f"{PACKAGE}.{name}").STAGES) for name in method_names()}


def methods() -> dict[str, Method]:
    """Method -> its declaration (``METHOD``; a module without one is a method with the defaults)."""
    out = {}
    for name in method_names():
        declared = getattr(importlib.import_module(f"{PACKAGE}.{name}"), "METHOD", None) or Method(name)
        if declared.name != name:
            raise RuntimeError(f"pipeline/methods/{name} declares METHOD.name {declared.name!r}")
        out[name] = declared
    return out


def in_order() -> list[Method]:
    """Every method's declaration, those with a :attr:`Method.position` first in that order, then the rest by name."""
    return sorted(methods().values(), key=lambda m: (m.position is None, m.position or 0, m.name))


def default_methods() -> list[str]:
    """The schema's default ``methods:``: every method declaring a :attr:`Method.position`, in that order."""
    return [m.name for m in in_order() if m.position is not None]


def declared_for(chosen: Iterable[str], field: str) -> list[Any]:
    """What ``field`` (a ``"module:attribute"`` declaration, e.g. ``input_checks``) names for each method of
    ``chosen`` that declares one, imported, in ``chosen``'s order; a name no method package holds declares nothing."""
    declared = methods()
    return [resolve(target) for name in chosen if name in declared and (target := getattr(declared[name], field))]


def data_parallel_stages() -> tuple[str, ...]:
    """Every method's data-parallel stages (:attr:`Method.data_parallel_stages`), in method order."""
    return tuple(stage for m in methods().values() for stage in m.data_parallel_stages)


def resolve(target: str) -> Any:
    """The object a declaration names as ``"module:attribute"``, imported now."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def bundle_exports() -> dict[str, str]:
    """Model file suffix -> ``"module:function"`` of its bundle export, from every method's declaration
    (:attr:`Method.bundle_exports`); a suffix two methods declare differently is an error naming both."""
    out: dict[str, tuple[str, str]] = {}
    for name, m in methods().items():
        for suffix, target in m.bundle_exports:
            if suffix in out and out[suffix][1] != target:
                raise RuntimeError(f"model files {suffix}: methods {out[suffix][0]!r} and {name!r} declare different "
                                   f"bundle exports")
            out[suffix] = (name, target)
    return {suffix: target for suffix, (_, target) in out.items()}


def resumable_rules() -> tuple[str, ...]:
    """Every method's rules that checkpoint and resume (:attr:`Method.resumable_rules`; the house's own are
    :data:`pipeline.resources.HOUSE_RESUMABLE_RULES`)."""
    return tuple(rule for m in methods().values() for rule in m.resumable_rules)


def audited_methods() -> list[str]:
    """The methods whose transcripts the one-run audit reads, sorted."""
    return [name for name, m in methods().items() if m.audited]


def report_categories() -> list[tuple[str, str]]:
    """(name prefix, report category) of every method declaring one, longest prefix first (a table goes to the
    first whose prefix its name has: ``empden_diagnostics...`` before ``empden...``)."""
    pairs = [(prefix, m.report_category) for m in methods().values() for prefix in m.report_prefixes]
    return sorted(pairs, key=lambda pair: (-len(pair[0]), pair[0]))


def merge_stages(core: Stages, methods: dict[str, Stages]) -> Stages:
    """``core`` followed by every method's stages; a stage name claimed twice is a programming error."""
    merged = dict(core)
    owner = {name: "core" for name in core}
    for method, stages in methods.items():
        for name, target in stages.items():
            if name in merged:
                raise RuntimeError(f"stage {name!r} of method {method!r} is already registered by {owner[name]!r}")
            merged[name], owner[name] = target, method
    return merged
