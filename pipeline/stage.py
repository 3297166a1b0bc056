"""The stage contract: ``stage(inputs, outputs, params)`` with declared keys.

A stage is a plain function taking three mappings: input paths, output paths and JSON
params. :func:`stage` records which keys it needs so the CLI can print them in ``--help``
and reject a missing or unknown key with one line instead of a ``KeyError`` deep inside.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Paths = Mapping[str, Path]
Params = Mapping[str, Any]
StageFn = Callable[[Paths, Paths, Params], None]


#: the stage being run in this process (set while :meth:`StageSpec.__call__` runs it): what a table it writes names
#: as its maker (:func:`pipeline.reporting.tables.write_table`)
_RUNNING: contextvars.ContextVar[StageSpec | None] = contextvars.ContextVar("running_stage", default=None)


class PipelineError(Exception):
    """An error the user can fix (bad input, missing file); printed as one line."""


class DataNotFoundError(PipelineError, FileNotFoundError):
    """A dataset is not on disk where the config says; the message says how to provide it."""


@dataclass(frozen=True)
class StageSpec:
    name: str
    fn: StageFn
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    optional_inputs: tuple[str, ...] = ()
    optional_outputs: tuple[str, ...] = ()
    params: Mapping[str, str] | None = None
    #: accept any ``--in`` keys (e.g. one metrics file per table row)
    any_inputs: bool = False
    #: prefixes of numbered ``--in`` keys ``<prefix>_0``, ``<prefix>_1``, ... (one per shard), read by :func:`numbered`
    numbered_inputs: tuple[str, ...] = ()

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or "").strip()

    @property
    def code(self) -> str:
        """``module:function`` of the stage's code, e.g. ``pipeline.methods.straightdp.table:straightdp_table``."""
        return f"{self.fn.__module__}:{self.fn.__qualname__}"

    @property
    def source(self) -> str:
        """``path/to/module.py:line`` where the stage's function is defined (relative to the package's parent)."""
        path = Path(inspect.getsourcefile(self.fn) or "?")
        root = Path(__file__).resolve().parents[1]
        shown = path.resolve().relative_to(root) if path.resolve().is_relative_to(root) else path
        return f"{shown}:{inspect.getsourcelines(self.fn)[1]}"

    def check(self, inputs: Paths, outputs: Paths) -> None:
        for kind, given, required, optional in (
            ("--in", inputs, self.inputs, self.optional_inputs),
            ("--out", outputs, self.outputs, self.optional_outputs),
        ):
            missing = [k for k in required if k not in given]
            unknown = [k for k in given if k not in required and k not in optional]
            if kind == "--in":
                unknown = [] if self.any_inputs else [k for k in unknown if _prefix(k) not in self.numbered_inputs]
                optional = optional + tuple(f"{prefix}_<n>" for prefix in self.numbered_inputs)
            if missing:
                raise PipelineError(f"stage {self.name}: missing {kind} {', '.join(missing)} "
                                    f"(expected {kind} {' '.join(k + '=PATH' for k in required)})")
            if unknown:
                allowed = ", ".join(required + optional) or "none"
                raise PipelineError(f"stage {self.name}: unknown {kind} key {unknown[0]!r} (allowed: {allowed})")

    def __call__(self, inputs: Paths, outputs: Paths, params: Params) -> None:
        inputs = {k: Path(v) for k, v in inputs.items()}
        outputs = {k: Path(v) for k, v in outputs.items()}
        self.check(inputs, outputs)
        token = _RUNNING.set(self)
        try:
            self.fn(inputs, outputs, dict(params))
        finally:
            _RUNNING.reset(token)


def running_stage() -> StageSpec | None:
    """The stage this process is running, or None outside a stage (a test calling a helper directly)."""
    return _RUNNING.get()


def stage(name: str, *, inputs: tuple[str, ...] = (), outputs: tuple[str, ...] = (),
          optional_inputs: tuple[str, ...] = (), optional_outputs: tuple[str, ...] = (),
          params: Mapping[str, str] | None = None, any_inputs: bool = False,
          numbered_inputs: tuple[str, ...] = ()) -> Callable[[StageFn], StageSpec]:
    """Declare a function as the DAG stage ``name`` with its input/output keys.

    ``params`` maps each parameter name to a one-line description for ``--help``; ``numbered_inputs``
    names the prefixes of numbered inputs (``features`` allows ``--in features_0=... features_1=...``).
    """

    def wrap(fn: StageFn) -> StageSpec:
        return StageSpec(name, fn, tuple(inputs), tuple(outputs), tuple(optional_inputs),
                         tuple(optional_outputs), params, any_inputs, tuple(numbered_inputs))

    return wrap


def _prefix(key: str) -> str | None:
    """``features`` of ``features_3``; None for a key that is not numbered."""
    prefix, _, number = key.rpartition("_")
    return prefix if prefix and number.isdigit() else None


def numbered(inputs: Mapping[str, Path], prefix: str, stage_name: str) -> list[Path]:
    """The inputs ``<prefix>_0 .. <prefix>_<n-1>`` in order (none: an empty list); a gap is a one-line error."""
    keys = [k for k in inputs if _prefix(k) == prefix]
    expected = [f"{prefix}_{i}" for i in range(len(keys))]
    if sorted(keys) != sorted(expected):
        raise PipelineError(f"{stage_name}: --in {prefix}_0 .. {prefix}_<S-1> expected, got {', '.join(sorted(keys))}")
    return [Path(inputs[k]) for k in expected]


def reject_unknown_params(stage_name: str, params: Mapping[str, Any], known: Iterable[str]) -> None:
    """One line naming the first param of ``params`` that ``stage_name`` does not know (a typo, a stale rule)."""
    known = list(known)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise PipelineError(f"stage {stage_name}: unknown param {unknown[0]!r} (known: {', '.join(known)})")
