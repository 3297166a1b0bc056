"""Specifications of every method's wiring (pipeline/methods/<method>/wiring.py) over the House of config.yaml, and
the rule files' ``resources:`` they answer."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from pipeline.config import validate_config
from pipeline.wiring import House

ROOT = Path(__file__).parents[2]


def house(tmp_path: Path, edit: Callable[[dict[str, Any]], None] | None = None) -> House:
    """The House of config.yaml with its results under ``tmp_path``, edited in place by ``edit`` first."""
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    cfg["results_dir"] = str(tmp_path / "r")
    if edit:
        edit(cfg)
    return House.from_config(validate_config(cfg))


#: the keys a rule's ``resources:`` may ask for (pipeline.resources.Request)
REQUEST_KEYS = ("gpu", "gpu_mem_mb", "tasks", "mem_mb", "runtime")


def rule_resources(rule_file: str) -> dict[str, str]:
    """Rule -> its ``resources:`` directive as written (the text after the colon, continuation lines joined) of every
    rule of ``rules/<rule_file>`` that has one (rules inside ``if`` blocks and checkpoints included; a ``use rule``
    inherits its rule's)."""
    text = (ROOT / "rules" / rule_file).read_text()
    found: dict[str, str] = {}
    for block in re.split(r"\n(?=[ ]*(?:rule \w+:|checkpoint \w+:|use rule ))", text):
        m = re.match(r"([ ]*)(?:rule|checkpoint) (\w+):", block)
        directive = re.search(r"\n([ ]+)resources:(.*)((?:\n\1[ ]+.*)*)", block)
        if directive:
            assert m, f"rules/{rule_file}: a resources directive outside a rule: {directive.group(0)!r}"
            found[m.group(2)] = " ".join(part.strip() for part in directive.group(2, 3) if part.strip())
    return found


def check_requests(wiring: Any, rule_file: str, table: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every rule of ``rules/<rule_file>`` has its request in ``table`` and the table no other rule; the wiring forms
    each (its keys :data:`REQUEST_KEYS`, memory and runtime always, each number a positive int, else a function of
    the job's wildcards). Returns rule -> its resources."""
    rules = rule_resources(rule_file)
    assert set(table) == set(rules), f"rules/{rule_file} and its table of requests differ"
    formed = {rule: wiring.resources(rule) for rule in rules}
    for rule, res in formed.items():
        assert set(res) <= set(REQUEST_KEYS) and {"mem_mb", "runtime"} <= set(res), (rule, res)
        for key, value in res.items():
            assert callable(value) or (isinstance(value, int) and value > 0), (rule, key, value)
    return formed
