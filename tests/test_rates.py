"""Device rates (pipeline.rates): one versioned file of seconds per unit of work per device, read by every cost model."""

from __future__ import annotations

import importlib
import inspect

import pytest
import yaml

import pipeline.resources as cost
from pipeline import rates
from pipeline.methods.dpdm import costs as dpdm_costs
from pipeline.methods.empden import costs as empden_costs
from pipeline.methods.straightdp import costs as straightdp_costs
from pipeline.config import ConfigError, check_sizes, validate_config
from pipeline.stage import PipelineError

COST_MODELED = {w: spec for w, spec in rates.workloads().items() if spec.cost_model}


def write(path, devices, **top):
    path.write_text(yaml.safe_dump({"format": rates.FORMAT, "devices": devices, **top}))
    return path


def estimate(**rates_):
    return {"kind": "estimate", "note": "n", "rates": rates_ or {w: 1.0 for w in COST_MODELED}}


def test_the_shipped_file_has_the_base_estimate_with_a_rate_for_every_cost_model():
    entry = rates.load_rates()[rates.BASE_ENTRY]
    assert entry.kind == "estimate" and set(COST_MODELED) <= set(entry.rates) and not entry.counts_flops
    for workload, spec in COST_MODELED.items():
        # the cost model named for a workload exists and reads its rate
        module, _, fn = spec.cost_model.partition(":")
        assert f'rate(config, "{workload}")' in inspect.getsource(getattr(importlib.import_module(module), fn))


@pytest.mark.parametrize("workload, fn, extra", [
    ("dpdm_dpsgd", dpdm_costs.train_runtime_min, {"data": {"image_size": 32}, "dpdm": {"epochs": 1000}}),
    ("straightdp_dpsgd", straightdp_costs.train_runtime_min, {"data": {"image_size": 28}}),
    ("empden_sample", empden_costs.rate_sample_runtime_min, {"empden": {"n_out": 50000}, "data": {"image_size": 32}}),
    ("pretrain_public", cost.pretrain_runtime_min, {"data": {"image_size": 32}, "pretrain": {"steps": 390625}}),
])
def test_a_cost_model_scales_with_the_rate_of_the_entry_the_config_names(workload, fn, extra, tmp_path, monkeypatch):
    base = rates.load_rates()[rates.BASE_ENTRY].rates
    slower = {**base, workload: base[workload] * 10}
    monkeypatch.setattr(rates, "RATES_FILE", write(tmp_path / "r.yaml", {
        "estimate": estimate(**base),
        "slow": {"kind": "measured", "measured_on": "GPU X", "date": "2026-12-05", "note": "", "rates": slower}}))
    fast, slow = (fn(validate_config({**extra, "slurm": {"device_rates": name}})) for name in ("estimate", "slow"))
    # every model is a fixed overhead plus headroom x work x rate: ten times the rate, ~ten times the variable part
    assert slow > 5 * fast


def test_the_default_entry_is_a_named_gpu_that_counts_flops_and_is_labelled_an_estimate():
    entry = rates.device_rates(validate_config({}))
    assert entry.name == rates.DEFAULT_ENTRY == "a100-40gb"
    # the GPU slurm.gpu_mem_gb's default of 40 GB describes
    assert validate_config({})["slurm"]["gpu_mem_gb"] == 40
    assert entry.counts_flops and entry.kind == "estimate" and entry.efficiency == 0.3
    assert entry.peak_tflops["tf32"] == 156.0 and "assumed" in entry.describe()


def test_a_config_naming_no_entry_of_the_file_fails_in_one_line_before_any_job():
    with pytest.raises(ConfigError, match=r"^config error at slurm.device_rates: no entry 'h100' in device_rates.yaml"):
        check_sizes(validate_config({"slurm": {"device_rates": "h100"}}))


@pytest.mark.parametrize("devices, top, message", [
    ({"estimate": estimate()}, {"format": "other/1"}, "not a device rates file"),
    ({"gpu": estimate()}, {}, "at least the 'estimate' entry"),
    ({"estimate": estimate(dpdm_dpsgd=-1.0)}, {}, "rate of dpdm_dpsgd must be seconds > 0"),
    ({"estimate": estimate(warp_drive=1.0)}, {}, "unknown workload 'warp_drive'"),
    ({"estimate": {**estimate(), "kind": "guess"}}, {}, "kind must be one of estimate, measured"),
    ({"estimate": estimate(), "h100": {**estimate(), "kind": "measured"}}, {}, "names its device"),
    ({"estimate": estimate(), "g": {**estimate(), "peak_tflops": {"fp8": 9.0}, "efficiency": 0.3, "headroom": 2}}, {},
     "peak_tflops must map dtypes"),
    ({"estimate": estimate(), "g": {**estimate(), "peak_tflops": {"tf32": 9.0}, "efficiency": 1.5, "headroom": 2}}, {},
     r"efficiency must be a share of the peak in \(0, 1\], got 1.5"),
    ({"estimate": estimate(), "g": {**estimate(), "peak_tflops": {"tf32": 9.0}, "efficiency": 0.3}}, {},
     "headroom must be a factor >= 1, got None"),
])
def test_a_malformed_rates_file_is_refused_with_the_entry_and_key(devices, top, message, tmp_path):
    path = write(tmp_path / "r.yaml", devices, **top)
    with pytest.raises(PipelineError, match=message):
        rates.load_rates(path)


def test_an_entry_without_a_rate_a_cost_model_needs_names_it(tmp_path, monkeypatch):
    monkeypatch.setattr(rates, "RATES_FILE", write(tmp_path / "r.yaml", {
        "estimate": estimate(), "part": {"kind": "measured", "measured_on": "X", "date": "d", "rates": {"features": 1}}}))
    with pytest.raises(PipelineError, match="entry 'part' of r.yaml has no rate for dpdm_dpsgd"):
        dpdm_costs.train_runtime_min(validate_config({"slurm": {"device_rates": "part"}}))


def test_writing_an_entry_keeps_the_others_and_reads_back_equal(tmp_path):
    path = write(tmp_path / "r.yaml", {"estimate": estimate()})
    entry = rates.DeviceRates(name="h200", kind="measured", note="make gpu-check", measured_on="NVIDIA H200",
                              date="2026-12-05", rates={w: 0.5 for w in rates.workloads()},
                              peak_mem_mb={"features": 12.5})
    rates.write_entry(entry, path)
    back = rates.load_rates(path)
    assert back["h200"] == entry and back["estimate"].rates == estimate()["rates"]
    assert path.read_text().startswith(rates.HEADER)
    assert back["h200"].describe() == "rates: measured on NVIDIA H200 (2026-12-05, make gpu-check; entry h200)"
    assert "not a GPU measurement" in back["estimate"].describe()


def test_the_named_gpus_state_their_datasheet_peaks_an_assumed_efficiency_and_say_so_in_the_plan():
    entries = rates.load_rates()
    for name, tf32 in (("a100-40gb", 156.0), ("h100-80gb", 494.7), ("h200", 494.7), ("l40s", 183.0)):
        e = entries[name]
        assert e.counts_flops and e.kind == "estimate" and e.peak_tflops["tf32"] == tf32
        # one second at 30% of the peak of the dtype the workload runs in
        assert e.workload_seconds(tf32 * 1e12 * 0.3, "pretrain_public") == pytest.approx(1.0)
        assert "ESTIMATE until gpu-check measures the efficiency" in e.describe()
        assert set(COST_MODELED) <= set(e.rates)  # the rules not yet counted read the rates
    assert not entries["estimate"].counts_flops
    no_fp64 = rates.DeviceRates(**{**entries["a100-40gb"].__dict__, "peak_tflops": {"tf32": 156.0}})
    with pytest.raises(PipelineError, match="states no fp64 peak"):
        no_fp64.workload_seconds(1.0, "empden_sample")


def test_an_entry_with_peaks_writes_and_reads_back_equal(tmp_path):
    path = write(tmp_path / "r.yaml", {"estimate": estimate()})
    named = rates.load_rates()["h100-80gb"]
    rates.write_entry(named, path)
    assert rates.load_rates(path)["h100-80gb"] == named


def test_a_measured_efficiency_is_read_for_its_workload_and_the_entrys_for_the_others(tmp_path):
    named = rates.load_rates()["h100-80gb"]
    measured = rates.DeviceRates(**{**named.__dict__, "name": "h100-measured", "kind": "measured",
                                    "measured_on": "NVIDIA H100 80GB HBM3", "date": "2026-12-07",
                                    "efficiency": 0.2, "efficiencies": {"unet_sample": 0.5, "empden_sample": 0.05}})
    path = write(tmp_path / "r.yaml", {"estimate": estimate()})
    rates.write_entry(measured, path)
    back = rates.load_rates(path)["h100-measured"]
    assert back == measured and "unet_sample 0.5" in back.describe()
    assert back.workload_seconds(494.7e12 * 0.5, "unet_sample") == pytest.approx(1.0)  # TF32 at its measured 0.5
    assert back.workload_seconds(67e12 * 0.05, "empden_sample") == pytest.approx(1.0)  # FP64 at its measured 0.05
    assert back.workload_seconds(67e12 * 0.2, "flow_train") == pytest.approx(1.0)  # FP32 at the entry's 0.2


def test_a_cost_model_that_counts_flops_asks_in_inverse_proportion_to_its_workloads_measured_efficiency(
        tmp_path, monkeypatch):
    named = rates.load_rates()["a100-40gb"]
    slow = rates.DeviceRates(**{**named.__dict__, "name": "slow", "efficiencies": {"dpdm_dpsgd": 0.03}})
    path = write(tmp_path / "r.yaml", {"estimate": estimate()})
    rates.write_entry(named, path)
    rates.write_entry(slow, path)
    monkeypatch.setattr(rates, "RATES_FILE", path)
    config = {"data": {"image_size": 32}, "dpdm": {"epochs": 1000}}
    a100, slow = (validate_config({**config, "slurm": {"device_rates": name}}) for name in ("a100-40gb", "slow"))
    # a tenth of the assumed 0.3: ten times the counted minutes of the same work
    units = 1e6
    assert cost.flop_minutes(slow, units, "dpdm_dpsgd", lambda: dpdm_costs.network(slow)) == pytest.approx(
        10 * cost.flop_minutes(a100, units, "dpdm_dpsgd", lambda: dpdm_costs.network(a100)))
    assert dpdm_costs.train_runtime_min(slow) > dpdm_costs.train_runtime_min(a100)
    # the same network's sampling is another workload: it runs at the entry's own efficiency, unchanged
    assert dpdm_costs.sample_runtime_min(slow) == dpdm_costs.sample_runtime_min(a100)


@pytest.mark.parametrize("blob, message", [
    ({"efficiencies": {"unet_sample": 0.5}}, "efficiencies are shares of peak_tflops, which it does not state"),
    ({"peak_tflops": {"tf32": 9.0}, "efficiency": 0.3, "headroom": 2, "efficiencies": {"warp": 0.5}},
     "efficiencies must map workloads"),
    ({"peak_tflops": {"tf32": 9.0}, "efficiency": 0.3, "headroom": 2, "efficiencies": {"unet_sample": 0}},
     "efficiencies must map workloads"),
])
def test_a_malformed_efficiency_is_refused_with_the_entry(blob, message, tmp_path):
    with pytest.raises(PipelineError, match=message):
        rates.load_rates(write(tmp_path / "r.yaml", {"estimate": estimate(), "g": {**estimate(), **blob}}))


def test_every_workload_states_how_its_flops_are_counted_and_in_which_number_format():
    for name, w in rates.workloads().items():
        assert w.dtype in rates.DTYPES and w.pass_ in rates.PASSES, name
        # a network's pass is counted by the footprint of its kind; work that is no network pass by its own count
        assert (w.network is None) == (w.pass_ == "own"), name
    assert {w.flop_factor for w in rates.workloads().values()} == {1.0, rates.DPSGD_FLOP_FACTOR}
