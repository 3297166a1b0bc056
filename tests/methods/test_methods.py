"""The method declarations (pipeline/methods/__init__.py): every house list is derived from them."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from pipeline.plugins import Method, audited_methods, method_names, methods, report_categories


def category(name: str) -> str | None:
    return next((cat for prefix, cat in report_categories() if name.startswith(prefix)), None)


def test_every_method_module_declares_itself_under_its_own_name():
    declared = methods()
    assert list(declared) == method_names() and all(m.name == name for name, m in declared.items())


def test_a_table_goes_to_its_papers_report_category():
    assert category("empden_table8_grid") == category("empden_diagnostics_proxy") == "3 EMPDEN"
    assert category("dpdm_table_main") == "4 DPDM" and category("straightdp_table1_main") == "5 STRAIGHTDP"
    assert category("sensgeo_table_sdp") == "6 SENSGEO" and category("baselines") == "7 Baselines"
    assert category("audit_one_run") == category("audit_mia") == "8 Audits"
    assert category("all_runs") is None  # the core's own categories live in pipeline/methods/_house.py


def test_the_one_run_audit_reads_the_methods_that_run_a_mechanism():
    # accounting's lines are configuration claims (no sampler ran), SENSGEO releases nothing, the audit is the audit
    assert audited_methods() == ["baselines", "dpdm", "empden", "straightdp"]


def test_prefixes_without_a_category_are_refused():
    with pytest.raises(ValueError, match="report_prefixes need a report_category"):
        Method("toy", report_prefixes=("toy",))


def test_a_longer_prefix_wins_over_a_shorter_one(monkeypatch):
    import pipeline.plugins as package

    monkeypatch.setattr(package, "methods", lambda: {"a": Method("a", "1 A", ("toy",)),
                                                     "b": Method("b", "2 B", ("toy_extra",))})
    assert report_categories() == [("toy_extra", "2 B"), ("toy", "1 A")]


#: every wiring class and the specification that covers it: the method packages' ``wiring.Wiring``, the evaluation
#: core's and the house's own outputs
WIRED = [*((f"pipeline.methods.{m}.wiring", "Wiring", f"{m}/test_wiring.py") for m in method_names()
           if (Path(__file__).parents[2] / "pipeline" / "methods" / m / "wiring.py").is_file()),
         ("pipeline.methods._evaluation", "Wiring", "test_evaluation_wiring.py"),
         ("pipeline.methods._house", "Outputs", "test_house_outputs.py")]


@pytest.mark.parametrize("module,cls,spec", WIRED, ids=[w[2] for w in WIRED])
def test_every_public_member_of_a_wiring_is_exercised_by_its_specification(module, cls, spec):
    """A rule file reads nothing a test does not: a new public method or property needs a test that calls it."""
    public = {n for n, _ in inspect.getmembers(getattr(importlib.import_module(module), cls)) if not n.startswith("_")}
    source = (Path(__file__).parent / spec).read_text()
    used = {node.attr for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute)}
    assert public - used == set()


def test_every_method_but_the_audit_free_ones_has_its_wiring():
    assert {w[2] for w in WIRED} >= {f"{m}/test_wiring.py" for m in method_names()}


#: every method with its own cost model (pipeline/methods/<method>/costs.py)
COSTED = [m for m in method_names() if (Path(__file__).parents[2] / "pipeline" / "methods" / m / "costs.py").is_file()]


@pytest.mark.parametrize("method", COSTED)
def test_every_cost_model_of_a_method_is_a_positive_integer_of_the_default_config(method):
    """Each function of a method's cost model that reads the configuration alone and counts minutes or MB (those with
    more arguments: tests/methods/<method>/test_costs.py)."""
    from pipeline.config import validate_config

    module = importlib.import_module(f"pipeline.methods.{method}.costs")
    cfg = validate_config({})
    counted = []
    for name, fn in inspect.getmembers(module, inspect.isfunction):
        sig = inspect.signature(fn)
        required = [p for p in sig.parameters.values() if p.default is inspect.Parameter.empty]
        if name.startswith("_") or fn.__module__ != module.__name__ or sig.return_annotation != "int":
            continue
        if [p.name for p in required] == ["config"]:
            value = fn(cfg)
            assert isinstance(value, int) and value > 0, name
            counted.append(name)
    assert counted, f"pipeline/methods/{method}/costs.py: no cost model of the configuration alone"
