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
            if m:
                indent = m.group(1)
                rules[m.group(2)] = f"\n{indent}    benchmark:\n{indent}        benchmark_path(" in block
    assert len(rules) > 60
    assert [r for r, has in rules.items() if not has and r != "all"] == []
