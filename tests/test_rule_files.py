"""The rule files themselves, read as text (no Snakemake started): what every rule must declare."""

from __future__ import annotations

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
