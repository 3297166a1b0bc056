"""`make gpu-check` (pipeline.gpu_check): each paper preset's heaviest workloads timed on this machine, printed
against the configured rates, and stored as a rates entry the cost models then read. Here in its tiny CPU mode."""

from __future__ import annotations

import pytest
import yaml

from pipeline import gpu_check, rates
from pipeline.gpu_check import Measurement


def test_a_measurement_is_stated_per_unit_at_the_workloads_reference_side():
    # 0.8 s per step of 4 images at 64x64 = 0.2 s per image there = 0.05 s per image at the 32x32 reference
    m = Measurement("pretrain_public", "celeba64", side=64, units=4, step_s=0.8, peak_mem_mb=1.0)
    assert m.seconds_per_unit == pytest.approx(0.2) and m.rate == pytest.approx(0.05)
    entry = rates.load_rates()[rates.BASE_ENTRY]
    assert m.predicted_per_unit(entry) == pytest.approx(entry.rates["pretrain_public"] * 4)
    # features have no reference side and no cost model yet: measured, not predicted
    f = Measurement("features", "cifar10", side=299, units=2, step_s=1.0, peak_mem_mb=1.0)
    assert f.rate == f.seconds_per_unit == 0.5 and f.predicted_per_unit(entry) is None


def test_every_workload_has_a_preset_and_a_builder():
    assert set(gpu_check.BUILDERS) == set(gpu_check.PRESET_OF) == set(rates.WORKLOADS)


def test_the_tiny_mode_measures_every_workload_and_writes_an_entry_the_plan_reads(tmp_path, capsys):
    path = tmp_path / "rates.yaml"
    path.write_text(rates.RATES_FILE.read_text())
    rc = gpu_check.main(["--tiny", "--device", "cpu", "--steps", "1", "--write", "tiny_cpu", "--rates-file", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "(tiny mode: not a paper workload)" in out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert set(rates.WORKLOADS) <= set(rows)
    assert "not in the cost models" in rows["features"]
    entry = rates.load_rates(path)["tiny_cpu"]
    assert entry.kind == "measured" and entry.measured_on.startswith("CPU") and "tiny mode" in entry.note
    assert set(entry.rates) == set(rates.WORKLOADS) and all(r > 0 for r in entry.rates.values())
    assert set(entry.peak_mem_mb) == set(rates.WORKLOADS)
    note = rates.device_rates({"slurm": {"device_rates": "tiny_cpu"}}, path).describe()
    assert note.startswith(f"rates: measured on {entry.measured_on} (") and note.endswith("entry tiny_cpu)")
    # the other entries are untouched
    shipped = yaml.safe_load(rates.RATES_FILE.read_text())["devices"]["estimate"]
    assert rates.load_rates(path)["estimate"].rates == shipped["rates"]


def test_an_entry_is_written_only_when_every_workload_was_measured(tmp_path, capsys):
    path = tmp_path / "rates.yaml"
    path.write_text(rates.RATES_FILE.read_text())
    rc = gpu_check.main(["--tiny", "--device", "cpu", "--steps", "1", "--workloads", "empden_sample",
                         "--write", "part", "--rates-file", str(path)])
    assert rc == 1 and "not written: not measured: dpdm_dpsgd, features" in capsys.readouterr().err
    assert "part" not in rates.load_rates(path)
