"""The replay's discovery of rebuilders: every mechanism module registers its own, and a process that only reads
ledgers (the replay, the tables, a bundle's check) imports no torch."""

from __future__ import annotations

import importlib
import subprocess
import sys

from pipeline.privacy import rebuild


def test_reading_and_certifying_ledgers_imports_no_torch(repo):
    code = ("import sys\n"
            "from pipeline.privacy import certify, replay, rebuild\n"
            "import pipeline.results.all_runs, pipeline.bundles.bundle\n"
            "rebuild.load_rebuilders()\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"


def test_the_engines_left_out_of_the_discovery_register_no_rebuilder():
    rebuild.load_rebuilders()
    found = dict(rebuild.REBUILDERS)
    assert {"dpsgd", "tha_dpsgd", "moment_release", "dp_merf_embedding", "pe_nn_histogram"} <= set(found)
    for name in rebuild.ENGINES:
        importlib.import_module(f"pipeline.privacy.{name}")
    assert rebuild.REBUILDERS == found


def test_dpsgd_reexports_its_accounting_half():
    from pipeline.privacy import dpsgd, dpsgd_plan

    assert dpsgd.DPSGDPlan is dpsgd_plan.DPSGDPlan and dpsgd.ledger_entry is dpsgd_plan.ledger_entry
    assert dpsgd.calibrate_noise_multiplier is dpsgd_plan.calibrate_noise_multiplier
