"""Which code audits a ledger line: one hook per mechanism, registered by the module that audits it.

Each canary module (``pipeline/audit/*_canaries.py``) registers the mechanisms it audits with
:func:`register_audit`; :func:`audit_hook` finds every module of this package the first time it is
asked, so a new mechanism's audit is one new file here and no list elsewhere (the stage
``audit_one_run`` dispatches through this registry; the replay's rebuilders are found the same way,
:func:`pipeline.privacy.rebuild.load_rebuilders`).

A hook gets the line and the audit's settings and returns ``(audit, columns)`` (the one-run audit
and its ``sampling_rate`` / ``attack`` columns) or, for a line no canary audit applies to, the
reason it is not audited.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any, Protocol

from pipeline.audit.one_run import CanaryAudit
from pipeline.privacy import ledger

AuditResult = tuple[CanaryAudit, dict[str, Any]] | str


class AuditHook(Protocol):
    def __call__(self, entry: ledger.LedgerEntry, *, m: int, significance: float, seed: int) -> AuditResult: ...


_HOOKS: dict[str, AuditHook] = {}
_LOADED = False


def register_audit(*mechanisms: str) -> Callable[[AuditHook], AuditHook]:
    """Decorator: the hook audits lines of ``mechanisms``; a mechanism audited twice is a programming error."""

    def deco(fn: AuditHook) -> AuditHook:
        for name in mechanisms:
            owner = _HOOKS.get(name)
            if owner is not None and owner is not fn:
                raise RuntimeError(f"mechanism {name!r} already has an audit hook ({owner.__module__}.{owner.__name__})")
            _HOOKS[name] = fn
        return fn

    return deco


def load_audits() -> None:
    """Import every module of :mod:`pipeline.audit` once, so each registers its hooks."""
    global _LOADED
    if _LOADED:
        return
    package = importlib.import_module("pipeline.audit")
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"pipeline.audit.{info.name}")
    _LOADED = True


def audit_hook(mechanism: str) -> AuditHook | None:
    """The hook that audits ``mechanism``'s lines, or ``None`` when no module audits it."""
    load_audits()
    return _HOOKS.get(mechanism)


def audited_mechanisms() -> list[str]:
    """Every mechanism some module audits, sorted."""
    load_audits()
    return sorted(_HOOKS)
