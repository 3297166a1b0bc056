"""A method is a plug-in: a toy method shaped like a real one, added to a copy of the house by its own files and
two edited lines.

The toy (``tests/toy_method/``) is laid over a copy of the repository: its folder ``pipeline/methods/toymean/``
(its declaration, stages, wiring, cost model, random stream and configuration section), its mechanism with its
ledger line and rebuilder in ``pipeline/privacy/`` (the privacy core stays the one place to audit), its audit hook
in ``pipeline/audit/``, its rule file, its caption and its docs page. The only existing lines it edits are the
Snakefile's include and ``config.yaml``'s ``methods:`` list. Then the plan of ``config.yaml`` has its rules with
their cost model's requests; the DAG runs it (the toy and the one-run audit only, for time) and it is in ``all``,
the replay, all_runs, the one-run audit, its certified bundle, the report; and the docs site lists its page.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.test_workflow import TINY, snakemake

TOY = Path(__file__).parent / "toy_method"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def copy_of_the_house(repo: Path, dest: Path) -> Path:
    """The repository's files (tracked and untracked, not ignored) in a fresh git repository at ``dest``."""
    files = [f for f in git(repo, "ls-files", "-co", "--exclude-standard").splitlines()
             if not f.startswith("tests/toy_method/") and (repo / f).is_file()]
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / f, dest / f)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "the house")
    return dest


def add_the_toy(house: Path) -> None:
    """The toy's files, and the two lines a new method edits: its include and its name in ``methods:``."""
    for src in TOY.rglob("*"):
        if src.is_file() and "__pycache__" not in src.parts:
            target = house / src.relative_to(TOY)
            assert not target.exists(), f"{target} exists: the toy adds files only"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    snakefile = house / "Snakefile"
    snakefile.write_text(snakefile.read_text().replace('include: "rules/review.smk"\n',
                                                       'include: "rules/review.smk"\ninclude: "rules/toymean.smk"\n'))
    config = house / "config.yaml"
    text = config.read_text()
    listed = re.search(r"^methods: \[(.*)\]$", text, flags=re.M)
    config.write_text(text.replace(listed.group(0), f"methods: [{listed.group(1)}, toymean]"))


def changed_lines(house: Path) -> dict[str, tuple[int, int]]:
    """file -> (lines added, lines removed) of the edits to the house's tracked files."""
    rows = [line.split("\t") for line in git(house, "diff", "--numstat").splitlines()]
    return {name: (int(added), int(removed)) for added, removed, name in rows}


@pytest.mark.slow
def test_a_toy_method_added_by_its_own_files_and_two_lines_is_in_every_house_list(repo, tmp_path):
    house = copy_of_the_house(repo, tmp_path / "house")
    add_the_toy(house)
    status = git(house, "status", "--porcelain", "--untracked-files=all").splitlines()
    assert sorted(s for s in status if not s.startswith("??")) == [" M Snakefile", " M config.yaml"]
    assert changed_lines(house) == {"Snakefile": (1, 0), "config.yaml": (1, 1)}  # one line each
    assert len(status) > 10
    results = tmp_path / "results"
    sizes = {k: v for k, v in TINY.items() if k != "methods"}  # the methods are config.yaml's
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(yaml.safe_dump({**sizes, "results_dir": str(results)}))
    # the plan of config.yaml's methods: `all` reaches the toy's rules, each with its cost model's request
    res = subprocess.run([sys.executable, "-m", "pipeline", "plan", "--configfile", str(tiny)], cwd=house,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {cells[1]: cells for line in res.stdout.splitlines()
            if line.startswith("| ") and len(cells := [c.strip() for c in line.split("|")]) > 9}
    assert {"toymean_release", "evaluate_toymean", "toymean_table"} <= set(rows)
    # toymean_release: 500 MB + the private split twice as float64 (100 images of 12 x 12 x 3): 0.5 GB
    assert rows["toymean_release"][2] == "1" and rows["toymean_release"][8] == "0.5"
    # the DAG: the core with the toy and the one-run audit
    cfg = tmp_path / "toy.yaml"
    cfg.write_text(yaml.safe_dump({**sizes, "results_dir": str(results), "methods": ["toymean", "audit"]}))
    res = snakemake(house, "--cores", "2", "all", "--configfile", str(cfg), timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    # `all` built its table: one certified row
    table = pd.read_parquet(results / "tables" / "toymean_table.parquet")
    assert list(table["method"]) == ["toymean"] and table["eps_certified"].between(0, 10).all()
    # the replay recomputed its claim from its transcript, bound to its run
    replay = json.loads((results / "tiny" / "ledger" / "replay.json").read_text())
    toy_claims = [c for c in replay["claims"] if c["transcript"].endswith("toymean_sigma2_seed0.jsonl")]
    assert replay["all_ok"] and len(toy_claims) == 1 and toy_claims[0]["ok"]
    # all_runs has its row beside the reference's
    all_runs = pd.read_parquet(results / "tables" / "all_runs.parquet")
    assert set(all_runs["method"]) == {"reference", "toymean"}
    assert all_runs.loc[all_runs["method"] == "toymean", "eps_certified"].iloc[0] == pytest.approx(
        table["eps_certified"].iloc[0])
    # the one-run audit found its mechanism's hook and passed its line
    audit = pd.read_parquet(results / "tables" / "audit_one_run.parquet")
    assert list(audit["mechanism"]) == ["toymean_class_means"] and audit["passed"].all()
    # its noise is drawn from its own declared stream, which the house's stream list finds (pipeline.seeds)
    res = subprocess.run([sys.executable, "-c", "from pipeline.seeds import all_streams, method_streams; "
                          "print(all_streams()['toymean.noise'].purpose in method_streams())"],
                         cwd=house, capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() == "True", res.stderr[-2000:]
    # its certified bundle: exported by the house's rule and verified by the house's reader
    res = snakemake(house, "--cores", "2", "export_bundles", "--configfile", str(cfg), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    bundle = results / "bundles" / "toymean" / "toymean_sigma2_seed0"
    res = subprocess.run([sys.executable, "-m", "pipeline", "verify_bundle", str(bundle)], cwd=house,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    # the summary page and the report show it, in the category its METHOD declares
    assert "toy mean" in (results / "index.html").read_text()
    report = tmp_path / "report.html"
    res = snakemake(house, "--report", str(report), "--configfile", str(cfg))
    assert res.returncode == 0, res.stderr[-3000:]
    page = report.read_text()
    assert "toymean_table.html" in page and "7 Toy mean" in page
    # the docs site: its page in the nav by its declaration, its caption and its keys rendered, mkdocs.yml untouched
    site = tmp_path / "site"
    res = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "-q", "-d", str(site)],
                         cwd=house, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    toy_page = (site / "methods" / "toymean.html").read_text()
    assert "toymean_table" in toy_page and "toymean.sigma" in toy_page
    assert 'href="methods/toymean.html"' in (site / "index.html").read_text()
    # its own config section is validated with the house's: a misspelt key of it stops the run in one line
    bad = tmp_path / "typo.yaml"
    bad.write_text(yaml.safe_dump({"toymean": {"sigmma": 3.0}}))
    res = snakemake(house, "-n", "all", "--configfile", str(cfg), str(bad))
    assert res.returncode != 0 and "config error at toymean.sigmma: unknown key" in res.stderr
