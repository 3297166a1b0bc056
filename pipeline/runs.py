"""Run names: the one grammar every method's run (and every EMPDEN cell) is named in.

A run is named by a path token, so any run can be asked for by path and read back from it. A kind
of run declares its fields once, in order, as a :class:`RunGrammar`; the token writes each field
as ``<key><value>`` and joins them with ``_``::

    edm_eps0p2_K4_seed0           DPDM: <param>_eps<eps>_K<K>_seed<seed>
    latent-uniform_eps0p3_seed0   STRAIGHTDP: [<arm>-]<row>_eps<eps>_seed<seed>
    hybrid/p65_B50_T3_beta1_s0    EMPDEN: <method>/p<p>_B<B>_T<T>_beta<beta>_s<seed>

A field with an empty key is a bare word (DPDM's parameterisation); a *head* field stands in front of
the rest with its own separator (STRAIGHTDP's arm and ``-``, absent for the main configuration;
EMPDEN's method and ``/``). :meth:`RunGrammar.write` writes a token, :meth:`RunGrammar.read` is its
exact inverse (it refuses, in one line, any text that ``write`` would not have written, so one run
has one name) and :attr:`RunGrammar.pattern` is the same grammar as a Snakemake wildcard constraint.
:class:`NamedRun` gives a frozen dataclass ``name`` and ``from_name`` from its ``GRAMMAR``.

Numbers are written by :func:`fmt_num` (one encoding for every kind): Python's shortest text that
reads back to the same float, the point written ``p`` so a token never has a dot (a path's stem is
also a valid Snakemake input name): 0.2 -> ``0p2``, 10 -> ``10``, 1e-05 -> ``1e-05``.

Pure Python (no torch, no Snakemake): the rule files import it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, TypeVar

from pipeline.stage import PipelineError

#: a number as :func:`fmt_num` writes it (no groups of its own, so it can stand in a larger pattern)
NUMBER_PATTERN = r"-?[0-9]+(?:p[0-9]+)?(?:e[-+][0-9]+)?"
#: a count or a seed as a path token
INT_PATTERN = r"[0-9]+"
#: floats with no fractional part below this are written as plain integers (``1000000``, not ``1e+06``);
#: above it a double no longer holds every integer, and repr's exponent form is the exact one
_PLAIN_INT_LIMIT = 1e16


class RunNameError(PipelineError, ValueError):
    """A run name outside its grammar, or a value its grammar cannot write; one line, naming both.

    A :class:`PipelineError` so the CLI prints it as one line, a ValueError as the run classes have
    always raised."""


def fmt_num(x: float) -> str:
    """A number as a path token: 0.2 -> '0p2', 10 -> '10', 1e-05 -> '1e-05', -1.5 -> '-1p5'.

    The shortest text that reads back to exactly ``x`` (integers without a point), the point written
    ``p``, so no two floats share a token. Why this one: for every number below 1e6 with at most six
    significant digits it is ``%g``'s text, which DPDM's, STRAIGHTDP's and the baselines' names used (above
    1e6 ``%g`` wrote ``1e+06``, which their parsers refused; past six digits it rounded, so a name read
    back as another number); and it is EMPDEN's cell encoding (repr, integers plain) except that a sign
    or exponent is written ``-`` and not ``m``, which the EMPDEN rules' wildcards never matched.
    """
    x = float(x)
    if not math.isfinite(x):
        raise RunNameError(f"a run name cannot hold the number {x!r} (only finite numbers)")
    if x.is_integer() and abs(x) < _PLAIN_INT_LIMIT:
        return str(int(x))
    return repr(x).replace(".", "p")


def parse_num(token: str) -> float:
    """Inverse of :func:`fmt_num`: the number a token writes (a one-line RunNameError when it is none)."""
    if not re.fullmatch(NUMBER_PATTERN, token):
        raise RunNameError(f"{token!r} is not a number as a run name writes it (e.g. 10, 0p2, 1e-05)")
    return float(token.replace("p", "."))


@dataclass(frozen=True)
class Field:
    """One field of a run name: the attribute it holds, the key written before its value, the text
    its values are written in (``pattern``, no groups of its own) and how a value is written and read."""

    attr: str
    key: str
    pattern: str
    write: Callable[[Any], str]
    read: Callable[[str], Any]
    #: the value's placeholder in the written form (``<eps>``); default the key, else the attribute
    label: str = ""
    #: what the value may be, for error lines (e.g. "one of edm, vpred, vp, ve")
    about: str = ""

    @property
    def form(self) -> str:
        """The field in the written form of its grammar, e.g. ``eps<eps>``."""
        return self.key + _placeholder(self.attr, self.key, self.label)


def _placeholder(attr: str, key: str, label: str) -> str:
    """A value's stand-in in a written form: ``<label>``, else ``<key>``, else ``<attr>``."""
    return f"<{label or key or attr}>"


def choice(attr: str, choices: tuple[str, ...], key: str = "", *, label: str = "") -> Field:
    """A field that is one of a fixed set of words (longest first in the pattern, so ``vpred`` is tried
    before ``vp`` and ``tha_moments`` before ``tha``)."""
    pattern = "|".join(re.escape(c) for c in sorted(choices, key=len, reverse=True))
    return Field(attr, key, pattern, str, str, label, f"{_placeholder(attr, key, label)} one of {', '.join(choices)}")


def word(attr: str, pattern: str, key: str = "", *, label: str = "") -> Field:
    """A field whose value is any word matching ``pattern`` (a regex with no groups of its own)."""
    return Field(attr, key, pattern, str, str, label, f"{_placeholder(attr, key, label)} matching {pattern}")


def number(attr: str, key: str, *, label: str = "") -> Field:
    """A float field, written by :func:`fmt_num`."""
    return Field(attr, key, NUMBER_PATTERN, fmt_num, parse_num, label)


def integer(attr: str, key: str, *, label: str = "") -> Field:
    """A non-negative int field (a count or a seed), written in decimal."""
    return Field(attr, key, INT_PATTERN, _fmt_int, int, label)


def _fmt_int(value: Any) -> str:
    return str(int(value))


@dataclass(frozen=True)
class RunGrammar:
    """A kind of run's name: its fields in order, joined by ``_``, and an optional head field in front.

    ``what`` names the kind in error lines ("DPDM run"); ``example`` is a name of it, shown with them.
    ``head`` is written first, then ``head_sep``; with ``head_optional`` an empty head ("") is left out
    together with its separator (STRAIGHTDP's main configuration has no arm).
    """

    what: str
    fields: tuple[Field, ...]
    example: str
    head: Field | None = None
    head_sep: str = "-"
    head_optional: bool = False
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        attrs = [f.attr for f in self.all_fields]
        if len(set(attrs)) != len(attrs):  # a declaration error, caught when the module is imported
            raise ValueError(f"{self.what} grammar declares a field twice: {attrs}")
        object.__setattr__(self, "_regex", re.compile(self._regex_text(named=True)))

    @property
    def all_fields(self) -> tuple[Field, ...]:
        """The head (when declared), then the fields: every attribute a name holds."""
        return ((self.head,) if self.head else ()) + self.fields

    def _regex_text(self, *, named: bool) -> str:
        def group(f: Field) -> str:
            return f"(?P<{f.attr}>{f.pattern})" if named else f"(?:{f.pattern})"

        body = "_".join(re.escape(f.key) + group(f) for f in self.fields)
        if self.head is None:
            return body
        head = re.escape(self.head.key) + group(self.head) + re.escape(self.head_sep)
        return f"(?:{head})?{body}" if self.head_optional else head + body

    @property
    def pattern(self) -> str:
        """The grammar as a Snakemake wildcard constraint (a regex with no groups of its own)."""
        return self._regex_text(named=False)

    @property
    def form(self) -> str:
        """The written form, e.g. ``[<arm>-]<row>_eps<eps>_seed<seed>``."""
        body = "_".join(f.form for f in self.fields)
        if self.head is None:
            return body
        head = self.head.form + self.head_sep
        return f"[{head}]{body}" if self.head_optional else head + body

    def narrowed(self, attr: str, choices: tuple[str, ...]) -> RunGrammar:
        """The same grammar with the choice field ``attr`` allowed only ``choices``: the wildcard constraint
        of a rule that makes one method's runs (``narrowed("method", ("pe",)).pattern``)."""
        if attr not in [f.attr for f in self.all_fields]:
            raise ValueError(f"{self.what} grammar has no field {attr!r}")

        def narrow(f: Field) -> Field:
            return choice(f.attr, choices, f.key, label=f.label) if f.attr == attr else f

        return replace(self, fields=tuple(map(narrow, self.fields)), head=self.head and narrow(self.head))

    def _text(self, f: Field, values: Mapping[str, Any]) -> str:
        text = f.write(values[f.attr])
        # a value its own grammar could not read back would make a name that names no run
        if not re.fullmatch(f.pattern, text):
            raise RunNameError(f"{self.what}: {f.attr} = {values[f.attr]!r} cannot be written in a name "
                               f"{self.form} ({f.about or f'it would be {text!r}, not {f.pattern}'})")
        return text

    def write(self, values: Mapping[str, Any]) -> str:
        """The name of the run whose field values are ``values`` (attribute -> value)."""
        head = ""
        if self.head is not None and not (self.head_optional and values[self.head.attr] == ""):
            head = self.head.key + self._text(self.head, values) + self.head_sep
        return head + "_".join(f.key + self._text(f, values) for f in self.fields)

    def name_of(self, run: object) -> str:
        """The name of ``run``, an object with an attribute per field."""
        return self.write({f.attr: getattr(run, f.attr) for f in self.all_fields})

    def read(self, name: str) -> dict[str, Any]:
        """The field values ``name`` writes (the exact inverse of :meth:`write`); a one-line
        RunNameError for text outside the grammar or not as :meth:`write` writes it (``0p20``, ``seed01``)."""
        m = self._regex.fullmatch(name)
        if m is None:
            about = "; ".join(f.about for f in self.all_fields if f.about)
            raise RunNameError(f"{self.what} name {name!r} is not {self.form} ({about + '; ' if about else ''}"
                               f"e.g. {self.example})")
        values = {f.attr: "" if m[f.attr] is None else f.read(m[f.attr]) for f in self.all_fields}
        canonical = self.write(values)
        if canonical != name:  # one run, one name: only the path a run writes reads back as it
            raise RunNameError(f"{self.what} name {name!r} is not {self.form} as its run writes it: "
                               f"that run is {canonical!r}")
        return values


_Run = TypeVar("_Run", bound="NamedRun")


class NamedRun:
    """``name`` and ``from_name`` for a frozen dataclass whose fields its class attribute ``GRAMMAR`` declares."""

    GRAMMAR: ClassVar[RunGrammar]

    @property
    def name(self) -> str:
        """The run's path token (``GRAMMAR`` writes it)."""
        return self.GRAMMAR.name_of(self)

    @classmethod
    def from_name(cls: type[_Run], name: str) -> _Run:
        """The run a path token names (the inverse of :attr:`name`)."""
        return cls(**cls.GRAMMAR.read(name))
