"""The install story: one set of exact pins, shared by the Makefile and both conda envs."""

from __future__ import annotations

import re

import yaml


def _pins(lines):
    return sorted(l.strip() for l in lines if l.strip() and not l.strip().startswith(("#", "-")))


def test_requirements_are_exact_pins(repo):
    pins = _pins((repo / "envs" / "requirements.txt").read_text().splitlines())
    assert pins and all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][A-Za-z0-9.+]*", p) for p in pins), pins
    assert "torch==2.14.1" in pins and "torchvision==0.29.1" in pins


def test_conda_envs_carry_the_same_pins(repo):
    want = sorted(_pins((repo / "envs" / "requirements.txt").read_text().splitlines())
                  + _pins((repo / "envs" / "requirements-nodeps.txt").read_text().splitlines()))
    for env in ("cpu", "cuda"):
        spec = yaml.safe_load((repo / "envs" / f"{env}.yaml").read_text())
        pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
        assert _pins(pip) == want, env


def test_constraints_agree_with_requirements(repo):
    cons = {l.split("==")[0].lower().replace("_", "-"): l.strip()
            for l in (repo / "envs" / "constraints.txt").read_text().splitlines() if "==" in l}
    for pin in _pins((repo / "envs" / "requirements.txt").read_text().splitlines()):
        name, version = pin.split("==")
        assert cons[name.lower().replace("_", "-")].split("==")[1] == version, pin


def test_no_deps_packages_are_exact_pins_and_installed_by_the_makefile(repo):
    pins = _pins((repo / "envs" / "requirements-nodeps.txt").read_text().splitlines())
    assert pins and all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][A-Za-z0-9.+]*", p) for p in pins), pins
    assert "--no-deps -r envs/requirements-nodeps.txt" in (repo / "Makefile").read_text()


def test_no_default_profile(repo):
    # Snakemake merges profiles/default/ into every run, over --profile: it must not exist
    assert not (repo / "profiles" / "default").exists()
