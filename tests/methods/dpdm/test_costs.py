"""DPDM's cost model (pipeline/methods/dpdm/costs.py): a DP-SGD run, a sample set, the DP-SGD classifier and Fig. 3
ask for more as their work grows, a run on a named GPU for its own K, and its GPU memory is the shared DP-SGD
engine's plan."""

from __future__ import annotations

import pytest

import pipeline.resources as cost
from pipeline.config import load_config, validate_config
from pipeline.methods.dpdm import costs
from tests.conftest import REPO


@pytest.mark.parametrize(("fn", "small", "large"), [
    (costs.train_runtime_min, {"dpdm": {"epochs": 8}}, {"dpdm": {"epochs": 80000}}),
    (costs.train_mem_mb, {"dpdm": {"K": 1}}, {"dpdm": {"K": 32}}),
    (costs.sample_runtime_min, {"dpdm": {"sampling": {"n_samples": 500}}},
     {"dpdm": {"sampling": {"n_samples": 5000000}}}),
])
@pytest.mark.parametrize("entry", ["estimate", "a100-40gb"])  # rates only; the default, from counted FLOPs
def test_a_bigger_job_asks_for_more(fn, small, large, entry):
    slurm = {"slurm": {"device_rates": entry}}
    assert fn(validate_config({**large, **slurm})) > fn(validate_config({**small, **slurm}))


def test_a_runs_gpu_memory_is_the_dp_sgd_engines_plan_at_its_k():
    cfg = validate_config({})
    plan = cost.dpsgd_memory(costs.network(cfg), cfg["dpdm"]["micro_batch"], 8)
    assert costs.train_gpu_mem_mb(cfg, 8) == plan.predicted_mb > costs.train_gpu_mem_mb(cfg, 1)


def test_dp_sgd_on_a_named_gpu_asks_for_its_runs_own_k_and_the_estimate_entry_is_unchanged(monkeypatch):
    mnist = load_config(REPO / "config.yaml", REPO / "configs" / "mnist.yaml")
    mnist["slurm"]["device_rates"] = "estimate"
    before = (costs.train_runtime_min(mnist), costs.sample_runtime_min(mnist))
    mnist["slurm"]["device_rates"] = "h100-80gb"
    one, full = costs.train_runtime_min(mnist, K=1), costs.train_runtime_min(mnist)
    assert full > 8 * one  # K = 32's draws against K = 1's (which asks for the 30-minute floor)
    assert costs.sample_runtime_min(mnist) < before[1]
    # the estimate entry has no peaks: its requests are the rates', and no network is counted for them
    mnist["slurm"]["device_rates"] = "estimate"
    monkeypatch.setattr(cost, "_counted", lambda *a: pytest.fail("the estimate entry counted a network"))
    assert (costs.train_runtime_min(mnist), costs.sample_runtime_min(mnist)) == before


def test_the_classifier_and_the_variance_figure_grow_with_their_work():
    assert costs.classifier_runtime_min(validate_config({"dpdm": {"dpsgd_classifier": {"epochs": 1000}}})) > \
        costs.classifier_runtime_min(validate_config({}))
    figure = {"K": [1, 2, 4], "n_images": 3, "repeats": 24}
    small = validate_config({"dpdm": {"gradient_variance": figure}})
    large = validate_config({"dpdm": {"gradient_variance": {**figure, "repeats": 10000}}})
    assert costs.gradient_variance_runtime_min(large) > costs.gradient_variance_runtime_min(small)


def test_a_sample_sets_gpu_memory_is_the_denoisers_forward_over_its_batch_twice_where_a_sampler_guides():
    cfg = validate_config({})
    batch = cfg["dpdm"]["sampling"]["batch_size"]
    guided = any(c.get("guidance", 0) for c in cfg["dpdm"]["sampling"]["samplers"].values())
    plan = costs.sample_memory(cfg)
    assert plan.batch == batch * (2 if guided else 1)
    assert plan == cost.forward_memory("sample_dpdm", "edm_unet", costs.network(cfg), plan.batch)


def test_the_dp_sgd_classifiers_gpu_memory_is_the_engines_plan_of_the_downstream_cnn_at_its_micro_batch():
    cfg = validate_config({"dpdm": {"dpsgd_classifier": {"micro_batch": 50}}})
    plan = costs.classifier_memory(cfg)
    assert plan == cost.dpsgd_memory(cost.evalnet_network(cfg), 50, 1, kind="evalnet")
    larger = validate_config({"dpdm": {"dpsgd_classifier": {"micro_batch": 500}}})
    assert costs.classifier_memory(larger).predicted_bytes > plan.predicted_bytes


def test_fig3s_gpu_memory_is_its_largest_k_plan_and_the_float64_gradients_it_keeps():
    from pipeline import footprint

    figure = {"K": [1, 4, 16], "n_images": 3, "repeats": 24}
    cfg = validate_config({"dpdm": {"gradient_variance": figure}})
    net = cost.pretrain_network(cfg)
    params = footprint.footprint("edm_unet", net).params
    largest = max((cost.dpsgd_memory(net, 64 // K, K) for K in figure["K"]), key=lambda p: p.predicted_bytes)
    assert costs.gradient_variance_memory(cfg).predicted_bytes == pytest.approx(
        largest.predicted_bytes + 2 * 24 * params * 8)
    more = validate_config({"dpdm": {"gradient_variance": {**figure, "repeats": 240}}})
    assert costs.gradient_variance_memory(more).predicted_bytes > costs.gradient_variance_memory(cfg).predicted_bytes
