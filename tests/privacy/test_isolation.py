"""pipeline.privacy imports nothing from evaluation or reporting (SPEC, STYLE "What we add")."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import importlib, pkgutil, sys
import pipeline.privacy as pkg
for mod in pkgutil.walk_packages(pkg.__path__, "pipeline.privacy."):
    importlib.import_module(mod.name)
bad = sorted(m for m in sys.modules if m.startswith(("pipeline.evaluation", "pipeline.reporting")))
print(",".join(bad))
"""


def test_privacy_package_does_not_import_evaluation_or_reporting(repo):
    res = subprocess.run([sys.executable, "-c", CHECK], cwd=repo, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "", f"pipeline.privacy pulled in: {res.stdout.strip()}"
