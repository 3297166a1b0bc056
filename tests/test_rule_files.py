"""The rule files themselves, read as text (no Snakemake started): what every rule must declare."""

from __future__ import annotations

import ast
import importlib
import re


def test_every_rule_declares_its_benchmark_file(repo):
    # runtime.parquet is one row per job from these files: a rule without one would be invisible in it
    rules = {}
    for smk in sorted((repo / "rules").glob("*.smk")) + [repo / "Snakefile"]:
        # rules at any indent (a rule inside an `if` block, e.g. train_clip / import_clip, counts too)
        for block in re.split(r"\n(?=[ ]*rule \w+:)", smk.read_text()):
            m = re.match(r"([ ]*)rule (\w+):", block)
            # a target-only rule (all, export_bundles: inputs, no command) runs no job
            if m and re.search(r"\n[ ]*(shell|run|script):", block):
                indent = m.group(1)
                rules[m.group(2)] = f"\n{indent}    benchmark:\n{indent}        benchmark_path(" in block
    assert len(rules) > 60 and "all" not in rules and "export_bundle" in rules
    assert [r for r, has in rules.items() if not has] == []


#: the one function a rule file may define: it wraps Snakemake's own report() (flags a figure for the report)
SNAKEMAKE_ONLY = {"report_figure"}


def test_rule_files_hold_rules_and_no_wiring_function(repo):
    """A method's wiring (paths, params, targets, transcripts, records) is tested Python in pipeline/methods/<method>/
    wiring.py, the house's in pipeline/methods/_house.py; a rule file only wires their values into rules."""
    defined = {}
    for smk in sorted((repo / "rules").rglob("*.smk")) + [repo / "Snakefile"]:
        for name in re.findall(r"^\s*def (\w+)\(", smk.read_text(), flags=re.MULTILINE):
            defined[name] = smk.relative_to(repo)
    assert not (repo / "rules" / "functions").exists()
    assert {n: str(f) for n, f in defined.items() if n not in SNAKEMAKE_ONLY} == {}
    assert set(defined) == SNAKEMAKE_ONLY


#: who answers a rule file's ``resources:``: the house (its own rules) or the method's wiring, and the table of
#: requests that wiring reads (pipeline/resources.py, pipeline/methods/<method>/costs.py)
OWNERS = {"HOUSE": "pipeline.resources:HOUSE_REQUESTS", "ACCOUNTING": "pipeline.methods.accounting.costs:REQUESTS",
          "AUDIT": "pipeline.methods.audit.costs:REQUESTS", "BASELINES": "pipeline.methods.baselines.costs:REQUESTS",
          "DPDM": "pipeline.methods.dpdm.costs:REQUESTS", "EMPDEN": "pipeline.methods.empden.costs:REQUESTS",
          "EMPDEN_DIAGNOSTICS": "pipeline.methods.empden_diagnostics.costs:REQUESTS",
          "SENSGEO": "pipeline.methods.sensgeo.costs:REQUESTS",
          "STRAIGHTDP": "pipeline.methods.straightdp.costs:REQUESTS"}


def _resources_call(directive: str) -> ast.Call:
    """The one call a ``resources:`` directive spreads (``**X.resources("rule")``), parsed as Python."""
    (node,) = ast.parse(f"f({directive})", mode="eval").body.keywords
    assert node.arg is None and isinstance(node.value, ast.Call), directive
    return node.value


def test_every_rule_reads_its_whole_resources_from_its_owner_and_no_rule_file_holds_a_number(repo):
    """Issue #55: a rule's cost lives with its method (pipeline/methods/<method>/costs.py), the house's with the house
    (pipeline/resources.py); a rule file writes ``resources: **X.resources("its rule")`` and nothing else."""
    from tests.methods import rule_resources

    asked: dict[str, set[str]] = {}
    for smk in sorted((repo / "rules").glob("*.smk")):
        for rule, directive in rule_resources(smk.name).items():
            call = _resources_call(directive)
            numbers = [n.value for n in ast.walk(call) if isinstance(n, ast.Constant) and not isinstance(n.value, str)]
            assert numbers == [], f"rules/{smk.name}: rule {rule} writes {numbers} in its resources"
            owner = call.func.value.id if isinstance(call.func.value, ast.Name) else None
            assert call.func.attr == "resources" and owner in OWNERS, f"rules/{smk.name}: rule {rule}: {directive}"
            # each rule names its own request: a copied rule that kept its model's name would ask for the model's
            assert [a.value for a in call.args] == [rule] and not call.keywords, f"rules/{smk.name}: {directive}"
            asked.setdefault(owner, set()).add(rule)
    assert sum(len(r) for r in asked.values()) > 90
    # and every owner's table holds exactly the rules that ask it
    for owner, target in OWNERS.items():
        module, _, name = target.partition(":")
        assert set(getattr(importlib.import_module(module), name)) == asked.get(owner, set()), owner


def test_every_rule_that_runs_a_job_asks_for_its_resources(repo):
    from tests.methods import rule_resources

    for smk in sorted((repo / "rules").glob("*.smk")):
        for block in re.split(r"\n(?=[ ]*(?:rule|checkpoint) \w+:)", smk.read_text()):
            m = re.match(r"[ ]*(?:rule|checkpoint) (\w+):", block)
            if m and re.search(r"\n[ ]*(shell|run|script):", block):
                assert m.group(1) in rule_resources(smk.name), f"rules/{smk.name}: rule {m.group(1)}"
