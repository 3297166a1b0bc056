"""`make gpu-check` (pipeline.gpu_check): each paper preset's heaviest workloads timed on this machine, printed
against the configured rates, and stored as a rates entry the cost models then read. Here in its tiny CPU mode."""

from __future__ import annotations

import pytest
import yaml

from pipeline import gpu_check, rates
from pipeline.gpu_check import REPO, Measurement


def test_a_measurement_is_stated_per_unit_at_the_workloads_reference_side():
    # 0.8 s per step of 4 images at 64x64 = 0.2 s per image there = 0.05 s per image at the 32x32 reference
    m = Measurement("pretrain_public", "celeba64", side=64, units=4, step_s=0.8, peak_mem_mb=1.0)
    assert m.seconds_per_unit == pytest.approx(0.2) and m.rate == pytest.approx(0.05)
    entry = rates.load_rates()[rates.BASE_ENTRY]
    assert m.predicted_per_unit(entry) == pytest.approx(entry.rates["pretrain_public"] * 4)
    # features have no reference side and no cost model yet: measured, not predicted
    f = Measurement("features", "cifar10", side=299, units=2, step_s=1.0, peak_mem_mb=1.0)
    assert f.rate == f.seconds_per_unit == 0.5 and f.predicted_per_unit(entry) is None


def test_every_workload_has_a_preset_and_a_measurement_and_gpu_check_measures_the_houses_and_the_methods():
    from pipeline.plugins import methods, resolve

    declared = {name: entry for m in methods().values() if m.workloads for name, entry in resolve(m.workloads).items()}
    # every method that declares workloads names a module that exists, and each entry is the house's one shape
    assert {name for name, m in methods().items() if m.workloads} == {"dpdm", "empden", "straightdp"}
    assert all(isinstance(e, rates.MeasuredWorkload) for e in declared.values())
    assert set(gpu_check.HOUSE) == set(rates.HOUSE_WORKLOADS) and not set(declared) & set(gpu_check.HOUSE)
    assert set(gpu_check.workloads()) == set(gpu_check.HOUSE) | set(declared) == set(rates.workloads())
    for name, entry in gpu_check.workloads().items():
        assert entry.workload == rates.workloads()[name] and callable(entry.measure), name
        assert (REPO / "configs" / f"{entry.preset}.yaml").is_file(), name


def test_a_workload_declared_twice_is_refused(monkeypatch):
    from pipeline import plugins

    dpdm = plugins.methods()["dpdm"]
    twice = {"dpdm": dpdm, "other": plugins.Method("other", workloads=dpdm.workloads)}
    monkeypatch.setattr(plugins, "methods", lambda: twice)
    rates.declared_workloads.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="workload 'dpdm_dpsgd' of method 'other' is already declared by "
                                               "method 'dpdm'"):
            rates.declared_workloads()
    finally:
        rates.declared_workloads.cache_clear()


def test_an_entry_is_written_only_when_every_workload_was_measured(tmp_path, capsys):
    path = tmp_path / "rates.yaml"
    path.write_text(rates.RATES_FILE.read_text())
    rc = gpu_check.main(["--tiny", "--device", "cpu", "--steps", "1", "--workloads", "empden_sample",
                         "--write", "part", "--rates-file", str(path)])
    missing = ", ".join(sorted(set(rates.workloads()) - {"empden_sample"}))
    out, err = capsys.readouterr()
    assert rc == 1 and f"not written: not measured: {missing}" in err
    assert "no efficiencies: no entry's peaks match 'CPU" in out  # a CPU has no datasheet peak
    assert "part" not in rates.load_rates(path)


def test_efficiency_is_the_counted_flops_per_second_over_the_peak_of_the_workloads_dtype():
    # 2 s per step of 4 images of 3 TFLOP each = 6 TFLOP/s; against the TF32 peak of 20: 0.3
    m = Measurement("pretrain_public", "cifar10", side=32, units=4, step_s=2.0, peak_mem_mb=1.0, flops_per_unit=3e12)
    assert m.efficiency({"tf32": 20.0, "fp64": 1.0}) == pytest.approx(0.3)
    # EMPDEN's private step runs in float64: its FP64 peak is the one read
    e = Measurement("empden_sample", "cifar10", side=32, units=1, step_s=1.0, peak_mem_mb=1.0, flops_per_unit=1e12)
    assert e.efficiency({"tf32": 20.0, "fp64": 4.0}) == pytest.approx(0.25)
    # a named GPU entry predicts the step from the same count: measured / predicted = its efficiency / measured's
    a100 = rates.load_rates()["a100-40gb"]
    assert m.predicted_per_unit(a100) == pytest.approx(3e12 / (156e12 * 0.3))


@pytest.mark.parametrize("device, entry", [
    ("NVIDIA H100 80GB HBM3", "h100-80gb"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA L40S", "l40s"),
    ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", None), ("CPU x86_64, 2 threads", None)])
def test_a_gpus_peaks_are_found_by_its_name_and_an_unknown_device_has_none(device, entry):
    assert gpu_check.peaks_entry_for(device, rates.load_rates()) == entry


def test_the_flops_per_unit_are_the_cost_models_counts_of_the_presets_networks():
    from pipeline import resources
    from pipeline.footprint import footprint
    from pipeline.methods.dpdm import costs as dpdm_costs

    config = gpu_check.preset_config("cifar10", tiny=False)
    # the cached count the plan reads for the preset's public UNet (footprints.json), recounted here
    cached = footprint("edm_unet", resources.pretrain_network(config))
    assert gpu_check.flops_per_unit("pretrain_public", config) == pytest.approx(cached.train_flops_per_example)
    assert gpu_check.flops_per_unit("unet_sample", config) == pytest.approx(cached.forward_flops_per_example)
    mnist = gpu_check.preset_config("mnist", tiny=False)
    dpdm = footprint("edm_unet", dpdm_costs.network(mnist))
    # DP-SGD's step at the assumed factor over a training step: the factor the cost models count
    assert gpu_check.flops_per_unit("dpdm_dpsgd", mnist) == pytest.approx(
        rates.DPSGD_FLOP_FACTOR * dpdm.train_flops_per_example)
    # EMPDEN: accounting.N private steps of one output over n records and the m normaliser records, d = 3 x 32 x 32
    e, acc = config["empden"], config["accounting"]
    n = acc["n"] or config["data"]["private"]["n_private_train"] or 50000
    assert gpu_check.flops_per_unit("empden_sample", config) == pytest.approx(
        acc["N"] * 3 * 32 * 32 * (4 * n + 2 * (e["normaliser_n"] or 10000)))


def test_the_tiny_mode_measures_every_workload_and_writes_an_entry_of_rates_and_efficiencies_the_plan_reads(
        tmp_path, capsys):
    path = tmp_path / "rates.yaml"
    path.write_text(rates.RATES_FILE.read_text())
    rc = gpu_check.main(["--tiny", "--device", "cpu", "--steps", "1", "--peaks", "a100-40gb", "--write", "tiny_cpu",
                         "--rates-file", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "(tiny mode: not a paper workload)" in out
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in out.splitlines() if line.startswith("| ") and not line.startswith(("| workload", "| ---"))}
    assert set(rows) == set(rates.workloads())
    entry, a100 = rates.load_rates(path)["tiny_cpu"], rates.load_rates(path)["a100-40gb"]
    assert entry.kind == "measured" and entry.measured_on.startswith("CPU") and "tiny mode" in entry.note
    assert set(entry.rates) == set(entry.peak_mem_mb) == set(rates.workloads()) and min(entry.rates.values()) > 0
    note = rates.device_rates({"slurm": {"device_rates": "tiny_cpu"}}, path).describe()
    assert note.startswith(f"rates: measured on {entry.measured_on} (") and "measured share of its peaks" in note
    # the peaks and headroom are the named GPU's; each workload's efficiency is measured, the entry's is the least
    assert entry.counts_flops and entry.peak_tflops == a100.peak_tflops and entry.headroom == a100.headroom
    assert set(entry.efficiencies) == set(rates.workloads())
    assert entry.efficiency == pytest.approx(min(entry.efficiencies.values()))
    for workload, eff in entry.efficiencies.items():
        s_per_unit, gflop, printed = float(rows[workload][3]), float(rows[workload][7]), float(rows[workload][9])
        assert printed == pytest.approx(eff, rel=1e-2)
        # the efficiency is what reproduces the measured time from the count: FLOPs / (peak x efficiency)
        assert entry.workload_seconds(gflop * 1e9, workload) == pytest.approx(s_per_unit, rel=1e-2)
    # the other entries are untouched
    shipped = yaml.safe_load(rates.RATES_FILE.read_text())["devices"]["estimate"]
    assert rates.load_rates(path)["estimate"].rates == shipped["rates"]
