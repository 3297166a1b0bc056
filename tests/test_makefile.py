"""The Makefile's entry points: `make run CONFIG=...` checks its configuration files before anything starts."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def make_n(repo, *args: str) -> subprocess.CompletedProcess:
    """`make -n` as a user types it; when the tests themselves run under `make test` (CI), the parent make's
    MAKELEVEL/MAKEFLAGS would make this one a sub-make, which prints "Entering directory" on stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    return subprocess.run(["make", "-n", *args], cwd=repo, capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("target", ["run", "report"])
def test_a_missing_config_file_is_one_line_naming_it_before_any_command(repo, target):
    res = make_n(repo, target, "CONFIG=configs/no_such_preset.yaml")
    assert res.returncode == 2 and res.stdout == ""  # nothing would have run, not even the install
    assert len(res.stderr.strip().splitlines()) == 1
    assert "CONFIG file configs/no_such_preset.yaml not found" in res.stderr


def test_a_config_file_is_handed_to_snakemake_and_none_leaves_the_quick_tour(repo):
    preset = next(p for p in sorted((repo / "configs").glob("*.yaml")))
    rel = preset.relative_to(repo)
    assert f"all --configfile {rel}" in make_n(repo, "run", f"CONFIG={rel}").stdout
    plain = make_n(repo, "run").stdout
    assert "snakemake --cores 2 all" in plain and "--configfile" not in plain
    assert f"--configfile {rel}" in make_n(repo, "report", f"CONFIG={rel}").stdout
