"""The house's job costs (pipeline.resources): pure functions of the config that grow with the work they bound, the
shared arithmetic every method's cost model reads, and the house's own rules' requests. Each method's own cost model:
tests/methods/<method>/test_costs.py."""

from __future__ import annotations

import inspect
import math

import pytest

import pipeline.resources as cost
from pipeline.config import validate_config


def config(**sections):
    return validate_config(sections)


LIMIT_ARITHMETIC = ("max_job_minutes", "segments", "segment_runtime_min", "segment_retries")
#: the GPU-memory plan returns plans and specs, not a request (tested below)
MEMORY_PLAN = ("gpu_mem_bytes", "gpu_mem_gb_limit", "pretrain_network", "memory_plan", "accumulation_params",
               "pretrain_memory", "dpsgd_memory", "forward_memory", "evaluation_memory", "training_memory",
               "evalnet_memory", "public_denoiser_gpu_mem_mb")
#: counts of a network's work, and the rates and FLOP arithmetic the cost models read, not a request
COUNTS = ("counted_forward_flops", "evaluation_seconds", "evalnet_network", "rate", "flop_minutes", "workload_flops",
          "folder_mb", "footprint_of")
#: requests, and the function that reads a rule's from its owner's table (tested below)
REQUESTS = ("evaluation_request", "resources")


def test_every_cost_model_is_a_positive_integer_of_the_default_config():
    cfg = config()
    for name, fn in inspect.getmembers(cost, inspect.isfunction):
        # the time-limit arithmetic takes a prediction and may say "no limit" (tests/test_plan.py)
        if (name.startswith("_") or fn.__module__ != cost.__name__
                or name in LIMIT_ARITHMETIC + MEMORY_PLAN + COUNTS + REQUESTS):
            continue
        value = fn(cfg)
        assert isinstance(value, int) and value > 0, name


@pytest.mark.parametrize(("fn", "small", "large"), [
    (cost.evalnet_runtime_min, {"evaluation": {"evalnet": {"epochs": 1}}},
     {"evaluation": {"evalnet": {"epochs": 10000000}}}),
    (cost.pretrain_runtime_min, {"pretrain": {"steps": 100}}, {"pretrain": {"steps": 10000000}}),
])
@pytest.mark.parametrize("entry", ["estimate", "a100-40gb"])  # rates only; the default, from counted FLOPs
def test_a_bigger_job_asks_for_more(fn, small, large, entry):
    slurm = {"slurm": {"device_rates": entry}}
    assert fn(config(**large, **slurm)) > fn(config(**small, **slurm))


def test_only_images_above_16x16_get_more_than_one_torch_thread():
    assert cost.torch_threads(config()) == 1
    assert cost.torch_threads(config(data={"image_size": 32})) == 4


# ----------------------------------------------------------------------------- GPU memory


def test_a_batch_that_fits_the_gpu_is_one_pass_and_keeps_its_params():
    plan = cost.pretrain_memory(config())
    assert plan.micro_batch == plan.batch == 64 and plan.micro_batches == 1
    assert cost.accumulation_params(plan) == {}  # the job's params, and so its config id, as before
    assert plan.predicted_bytes < cost.gpu_mem_bytes(config()) + cost.GPU_RESERVE_BYTES


def test_the_paper_public_unet_is_split_into_micro_batches_that_fit_the_declared_gpu():
    from pipeline.config import load_config
    from tests.conftest import REPO

    cifar = load_config(REPO / "config.yaml", REPO / "configs" / "cifar10.yaml")
    plans = {}
    for gb in (24, 40, 80):
        cifar["slurm"]["gpu_mem_gb"] = gb
        plans[gb] = plan = cost.pretrain_memory(cifar)
        assert plan.batch == 512 and plan.micro_batches > 1
        assert plan.predicted_bytes <= gb * 2**30  # the plan's own column never exceeds the GPU
        assert cost.accumulation_params(plan) == {"batch_gpu": plan.micro_batch}
        # the micro-batch is the largest that fits: one more example would not
        over = plan.state_bytes + (plan.micro_batch + 1) * plan.per_example_bytes
        assert over > cost.gpu_mem_bytes(cifar)
    assert plans[24].micro_batch < plans[40].micro_batch < plans[80].micro_batch
    # ~206 MiB of saved activations per 32x32 image (times what the count does not see)
    assert plans[40].per_example_bytes == pytest.approx(cost.TRANSIENT_FACTOR * 216e6, rel=0.05)


def test_a_gpu_too_small_for_one_example_is_a_one_line_config_error_naming_the_rule():
    from pipeline.config import load_config
    from pipeline.stage import PipelineError
    from tests.conftest import REPO

    cifar = load_config(REPO / "config.yaml", REPO / "configs" / "cifar10.yaml")
    cifar["slurm"]["gpu_mem_gb"] = 2
    with pytest.raises(PipelineError, match=r"^config error at slurm.gpu_mem_gb: rule dp_x needs about [0-9.]+ GB .* "
                                            r"more than the 2 GB declared$"):
        cost.pretrain_memory(cifar, "dp_x")


def test_dp_sgd_memory_grows_with_the_micro_batch_and_k_and_the_configured_micro_batch_is_kept():
    from pipeline.methods.dpdm import costs as dpdm_costs

    net = dpdm_costs.network(config())  # the shared DP-SGD engine's plan, on DPDM's UNet
    small, large_k, large_m = (cost.dpsgd_memory(net, 16, 1), cost.dpsgd_memory(net, 16, 8),
                               cost.dpsgd_memory(net, 64, 1))
    assert small.predicted_bytes < large_k.predicted_bytes and small.predicted_bytes < large_m.predicted_bytes
    assert (large_m.batch, large_m.micro_batch, large_m.micro_batches) == (64, 64, 1)


# ----------------------------------------------------------------------------- runtimes grounded in FLOPs


def test_on_a_named_gpu_a_counted_rule_asks_for_its_flops_at_the_entry_s_efficiency_times_its_headroom():
    from pipeline import footprint, rates
    from pipeline.config import load_config
    from tests.conftest import REPO

    cifar = load_config(REPO / "config.yaml", REPO / "configs" / "cifar10.yaml")
    cifar["slurm"]["device_rates"] = "h100-80gb"
    entry = rates.device_rates(cifar)
    assert entry.counts_flops and entry.headroom == 2.0 and entry.efficiency == 0.3
    fp = footprint.footprint("edm_unet", cost.pretrain_network(cifar))
    flops = cifar["pretrain"]["steps"] * cifar["pretrain"]["batch_size"] * fp.train_flops_per_example
    estimate_min = flops / (494.7e12 * 0.3) / 60  # the FLOP estimate at the entry's efficiency of TF32's peak
    asked = cost.pretrain_runtime_min(cifar)
    assert asked == 10 + int(2.0 * estimate_min)
    assert 1 <= asked / estimate_min <= 4
    # 200 Mimg x 127 GFLOP: ~47.5 h at 30% of an H100's TF32 peak (the old rate asked for 33.5 h, under it)
    assert 40 * 60 < estimate_min < 55 * 60
    cifar["slurm"]["device_rates"] = "a100-40gb"
    assert cost.pretrain_runtime_min(cifar) > 3 * asked  # 156 against 494.7 TFLOP/s


def test_the_evaluation_on_a_named_gpu_asks_for_its_counted_networks_and_its_measured_host_work(monkeypatch):
    from pipeline import footprint
    from pipeline.config import load_config
    from tests.conftest import REPO

    cifar = load_config(REPO / "config.yaml", REPO / "configs" / "cifar10.yaml")
    cifar["slurm"]["device_rates"] = "estimate"
    before = cost.evaluation_runtime_min(cifar, 50000)
    cifar["slurm"]["device_rates"] = "h100-80gb"
    flops, host = cost.evaluation_seconds(cifar, 50000)
    inception = footprint.footprint("inception_v3", {"shape": [3, 32, 32]}).forward_flops_per_example
    assert 10e9 < inception < 13e9  # torch-fidelity's Inception-V3 at 299x299: ~5.7 GMAC
    # the forward passes: the samples twice (FID against test and against val), test and val once; the downstream
    # CNN's training is its own workload
    assert set(flops) == {"features", "evalnet_train"} and flops["evalnet_train"] > 0
    assert flops["features"] > (2 * 50000 + 5000 + 500) * inception
    assert 60 < host < 15 * 60  # 12 square roots of 2048x2048 covariances and the covariances themselves
    asked = cost.evaluation_runtime_min(cifar, 50000)
    # the job's start counted with its work, all of it x headroom 2
    work = sum(flops.values()) / (494.7e12 * 0.3) + host + cost.EVALUATION_STARTUP_S
    assert asked == math.ceil(2.0 * work / 60)
    assert asked < before / 3  # the CPU rate asked for 90 minutes a cell
    # more samples, more time; a shard's feature job only extracts its samples
    assert cost.evaluation_runtime_min(cifar, 10000) <= asked
    assert cost.evaluation_seconds(cifar, 12500, features_only=True) == ({"features": 12500 * inception}, 0.0)
    # scikit-learn's classifiers are host work, at their iteration caps
    mnist = load_config(REPO / "config.yaml", REPO / "configs" / "mnist.yaml")
    mnist["slurm"]["device_rates"] = "h100-80gb"
    with_sklearn = cost.evaluation_seconds(mnist, 60000)[1]
    mnist["evaluation"]["downstream"]["classifiers"] = ["cnn"]
    assert with_sklearn > cost.evaluation_seconds(mnist, 60000)[1] + 10 * 60
    # the estimate entry counts nothing
    cifar["slurm"]["device_rates"] = "estimate"
    monkeypatch.setattr(cost, "_counted", lambda *a: pytest.fail("the estimate entry counted a network"))
    monkeypatch.setattr(cost, "counted_forward_flops", lambda *a: pytest.fail("the estimate entry counted a network"))
    assert cost.evaluation_runtime_min(cifar, 50000) == before


# ----------------------------------------------------------------------------- each rule's request


def test_a_request_asks_for_the_keys_it_sets_in_the_rule_files_order():
    assert cost.Request(mem_mb=1000, runtime=5).resources() == {"mem_mb": 1000, "runtime": 5}
    per_job = lambda wildcards: 7  # noqa: E731 - a function of a job's wildcards stays one
    train = cost.Request(mem_mb=4000, runtime=per_job, gpu=2, gpu_mem_mb=per_job, tasks=1).resources()
    assert list(train) == ["gpu", "gpu_mem_mb", "tasks", "mem_mb", "runtime"] and train["runtime"] is per_job
    evaluation = cost.evaluation_request(config(), 100)
    assert (evaluation.gpu, evaluation.mem_mb, evaluation.runtime) == (
        1, cost.EVALUATION_MEM_MB, cost.evaluation_runtime_min(config(), 100))
    # its GPU memory counted when a DAG runs it
    assert evaluation.gpu_mem_mb(None) == cost.evaluation_memory(config()).predicted_mb


def test_a_rule_reads_its_request_from_its_owner_s_table_and_an_unknown_rule_is_named():
    cfg = config()
    table = {"fixed": cost.LIGHT_JOB, "formed": lambda c, w: cost.Request(mem_mb=w, runtime=c["seed"] + 1)}
    assert cost.resources(table, "fixed", cfg) == {"mem_mb": 1000, "runtime": 5}
    assert cost.resources(table, "formed", cfg, 3000) == {"mem_mb": 3000, "runtime": cfg["seed"] + 1}
    with pytest.raises(KeyError, match="no request for rule 'other' .*fixed, formed"):
        cost.resources(table, "other", cfg)


def test_the_house_asks_for_its_own_rules_requests(tmp_path):
    from tests.methods import check_requests, house, rule_resources

    h = house(tmp_path)
    house_files = ("data.smk", "evaluate.smk", "pretrain.smk", "report.smk", "review.smk", "bundles.smk")
    rules = {r for f in house_files for r in rule_resources(f)}
    assert set(cost.HOUSE_REQUESTS) == rules
    for f in house_files:
        check_requests(h, f, {r: q for r, q in cost.HOUSE_REQUESTS.items() if r in rule_resources(f)})
    pretrain = h.resources("pretrain_public")
    assert pretrain["runtime"] == cost.segment_runtime_min(h.config, cost.pretrain_runtime_min(h.config))
    assert pretrain["gpu_mem_mb"](None) == cost.pretrain_memory(h.config).predicted_mb  # counted when a DAG runs it
    reference = h.resources("evaluate_reference_real")
    expected = cost.evaluation_request(h.config, h.config["data"]["private"]["n_reference"]).resources()
    assert reference.keys() == expected.keys() and reference["runtime"] == expected["runtime"]
    assert reference["gpu_mem_mb"](None) == expected["gpu_mem_mb"](None)


def test_a_gradient_free_job_holds_the_weights_what_it_keeps_and_one_batch_at_the_forward_peak():
    from pipeline import footprint
    from pipeline.config import load_config
    from tests.conftest import REPO

    cifar = load_config(REPO / "config.yaml", REPO / "configs" / "cifar10.yaml")
    net = cost.pretrain_network(cifar)
    fp = footprint.footprint("edm_unet", net)
    plan = cost.forward_memory("sample", "edm_unet", net, 256, held_bytes=2**30)
    assert plan.predicted_bytes == pytest.approx(
        4 * fp.params + 2**30 + cost.TRANSIENT_FACTOR * fp.forward_peak_bytes(256) + cost.GPU_RESERVE_BYTES)
    # twice the batch, twice the activations
    twice = cost.forward_memory("sample", "edm_unet", net, 512, held_bytes=2**30)
    assert twice.predicted_bytes - plan.predicted_bytes == pytest.approx(256 * plan.per_example_bytes)
    # the evaluation: the larger of Inception's forward over its batch and the downstream CNN's training step
    ev = cost.evaluation_memory(cifar)
    inception = footprint.footprint("inception_v3", {"shape": [3, 32, 32]})
    assert ev.predicted_bytes >= 4 * inception.params + cost.TRANSIENT_FACTOR * inception.forward_peak_bytes(
        cifar["evaluation"]["batch_size"]) + cost.GPU_RESERVE_BYTES - 1
    assert ev.predicted_bytes < cost.gpu_mem_bytes(cifar)


def test_the_evaluation_cnns_training_holds_its_training_images_on_the_gpu_beside_its_batch():
    from pipeline import footprint

    cfg = config()
    fp = footprint.footprint("evalnet", cost.evalnet_network(cfg))
    batch, n = cfg["evaluation"]["evalnet"]["batch_size"], cfg["data"]["private"]["n_eval_train"]
    image = cost.image_channels(cfg) * cost.image_side(cfg) ** 2
    plan = cost.evalnet_memory(cfg)
    assert plan.predicted_bytes == pytest.approx(
        cost.TRAIN_STATE_BYTES_PER_PARAM * fp.params + cost.TRANSIENT_FACTOR * fp.activation_bytes(batch)
        + n * image + cost.GPU_RESERVE_BYTES)
    # an evaluation job's downstream CNN trains on its own samples: more samples, more memory held
    assert cost.evalnet_memory(cfg, n_images=10 * n).predicted_bytes == pytest.approx(
        plan.predicted_bytes + 9 * n * image)
