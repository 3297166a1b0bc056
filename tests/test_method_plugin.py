"""A method is a plug-in: a toy method added to a copy of the house by its own files and one include line.

The toy (``tests/toy_method/``: a Gaussian release of per-class means with its ledger line and rebuilder in
``pipeline/privacy/``, its audit hook in ``pipeline/audit/``, its stages and ``METHOD`` declaration in
``pipeline/methods/toymean/``, its rules and its caption) is laid over a copy of the repository; the only
existing file it edits is the Snakefile (its include line), and its name goes in the run's ``methods:``. Its config
keys are its own section (``pipeline/methods/toymean/schema.yaml``), validated with the house's.
Then the whole DAG runs and the toy is in `all`, the replay, all_runs, the one-run audit and the report.
"""

from __future__ import annotations

import json
import shutil
import subprocess
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
    for src in TOY.rglob("*"):
        if src.is_file() and "__pycache__" not in src.parts:
            target = house / src.relative_to(TOY)
            assert not target.exists(), f"{target} exists: the toy adds files only"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    snakefile = house / "Snakefile"
    snakefile.write_text(snakefile.read_text().replace('include: "rules/review.smk"\n',
                                                       'include: "rules/review.smk"\ninclude: "rules/toymean.smk"\n'))


@pytest.mark.slow
def test_a_toy_method_added_by_its_own_files_is_in_every_house_list(repo, tmp_path):
    house = copy_of_the_house(repo, tmp_path / "house")
    add_the_toy(house)
    status = git(house, "status", "--porcelain", "--untracked-files=all").splitlines()
    assert [s for s in status if not s.startswith("??")] == [" M Snakefile"]  # one existing file touched
    assert len(status) > 5
    results = tmp_path / "results"
    cfg = tmp_path / "toy.yaml"
    # the core (data, evaluation, replay, all_runs, the summary) with the toy and the one-run audit only
    cfg.write_text(yaml.safe_dump({**TINY, "results_dir": str(results), "methods": ["toymean", "audit"]}))
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
    # the summary page and the report show it, in the category its METHOD declares
    assert "toy mean" in (results / "index.html").read_text()
    report = tmp_path / "report.html"
    res = snakemake(house, "--report", str(report), "--configfile", str(cfg))
    assert res.returncode == 0, res.stderr[-3000:]
    page = report.read_text()
    assert "toymean_table.html" in page and "7 Toy mean" in page
    # its own config section is validated with the house's: a misspelt key of it stops the run in one line
    bad = tmp_path / "typo.yaml"
    bad.write_text(yaml.safe_dump({"toymean": {"sigmma": 3.0}}))
    res = snakemake(house, "-n", "all", "--configfile", str(cfg), str(bad))
    assert res.returncode != 0 and "config error at toymean.sigmma: unknown key" in res.stderr
