"""The baselines' cost model (pipeline/methods/baselines/costs.py): the GPU memory of their private stages, which grows
with the batch each stage runs, counts the stage's own networks, and bounds what the stage really holds when it runs
on the CPU (torch's memory tracker, the one pipeline/footprint.py counts with)."""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import pipeline.resources as cost
from pipeline import footprint
from pipeline.config import validate_config
from pipeline.methods.baselines import costs
from pipeline.methods.baselines.wiring import Wiring
from tests.methods import house

EMBEDDING = ("dp_merf", "dp_hp", "dp_ntk", "dp_mepf")


def config(**sections):
    return validate_config(sections)


class _NoHook:
    def remove(self) -> None:
        pass


def _peak(run, *modules):
    """The peak bytes of everything ``run()`` allocates, and of ``modules``' parameters, by torch's memory tracker.
    The tracker hooks the gradient of every parameter a forward uses, which a frozen one (DP-MEPF's CLIP) refuses: it
    is left unhooked (it has no gradient to count)."""
    from unittest import mock

    from torch.distributed._tools.mem_tracker import MemTracker

    def unless_frozen(register):
        return lambda t, hook: register(t, hook) if t.requires_grad else _NoHook()

    hooks = {name: unless_frozen(getattr(torch.Tensor, name))
             for name in ("register_hook", "register_post_accumulate_grad_hook")}
    tracker = MemTracker()
    for module in modules:
        tracker.track_external(module)
    with mock.patch.multiple(torch.Tensor, **hooks), tracker:
        run()
    return sum(dev["Total"] for dev in tracker.get_tracker_snapshot("peak").values())


@pytest.mark.parametrize("method", EMBEDDING)
def test_an_embedding_baseline_grows_with_its_generator_batch_and_its_sample_count(method):
    small = costs.embedding_memory(config(baselines={"dp_merf": {"batch_size": 100}}), method)
    large = costs.embedding_memory(config(baselines={"dp_merf": {"batch_size": 2000}}), method)
    assert (small.batch, large.batch) == (100, 2000)
    assert large.predicted_bytes > small.predicted_bytes
    # a sample count far above the batch: the generator's forward over every draw at once
    many = costs.embedding_memory(config(baselines={"dp_merf": {"batch_size": 100}, "n_samples": 10**7}), method)
    assert many.batch == 10**7 and many.predicted_bytes > small.predicted_bytes


def test_dp_mepf_holds_its_public_clip_and_its_larger_towers_cost_more():
    cfg = config()
    clip = footprint.footprint("clip", costs.clip_network(cfg))
    assert costs.embedding_memory(cfg, "dp_mepf").state_bytes > 4 * clip.params
    wider = config(evaluation={"clip": {"width": 128}})
    assert costs.embedding_memory(wider, "dp_mepf").predicted_bytes > costs.embedding_memory(cfg, "dp_mepf") \
        .predicted_bytes


def _features(method, cfg, public, clip_path):
    from pipeline.baselines.embedding_family import feature_map

    if method == "dp_merf":
        return None
    fm, _ = feature_map(method, cfg["baselines"][method], public, image_shape=(1, 16, 16), clip_path=clip_path,
                        generator=torch.Generator().manual_seed(0))
    return fm


def _held_bytes(fm):
    """What a feature map built on the CPU keeps (the stage moves it to the GPU): its tensors and its CLIP's weights."""
    if fm is None:
        return 0
    tensors = [v for v in vars(fm).values() if isinstance(v, torch.Tensor)]
    if hasattr(fm, "clip"):
        tensors += list(fm.clip.model.parameters())
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("method", EMBEDDING)
def test_the_prediction_bounds_what_the_stage_s_fit_and_sampling_hold_on_the_cpu(tmp_path, method):
    """The stage's own code on the CPU (dp_merf's ``train_generator``, the successors' ``matching_loss`` and
    ``fit_generator``, then ``generate``) at a small configuration: its peak, everything it allocates and the feature
    map it moves to the device, is at most the prediction less the driver's reserve."""
    from pipeline.baselines import dp_merf
    from pipeline.baselines.embedding_family import fit_generator, matching_loss
    from pipeline.evaluation import clip
    from tests.conftest import one_thread

    sections = {"baselines": {"dp_merf": {"batch_size": 300, "hidden": 64, "steps": 1, "n_features": 200},
                              "dp_hp": {"order": 6, "n_pairs": 50}, "dp_ntk": {"width": 40}, "n_samples": 400},
                "evaluation": {"clip": {"width": 32, "layers": 1, "embed_dim": 16}}}
    cfg = config(**sections)
    g, n_classes, d = cfg["baselines"]["dp_merf"], 10, 256
    clip_path = tmp_path / "clip.pt"
    c = cfg["evaluation"]["clip"]
    spec = clip.small_clip_config(16, width=c["width"], layers=c["layers"], embed_dim=c["embed_dim"],
                                  patch_size=c["patch_size"])
    torch.manual_seed(0)
    torch.save({"format": clip.FORMAT, "config": spec, "class_names": [str(k) for k in range(n_classes)],
                "template": clip.TEMPLATE, "state_dict": clip.build_clip(spec).state_dict()}, clip_path)
    public = torch.rand(64, d, dtype=torch.float64)
    fm = _features(method, cfg, public, clip_path)
    dim = 2 * g["n_features"] if fm is None else fm.dim
    mu = torch.randn(dim, n_classes, dtype=torch.float64) / math.sqrt(dim)
    W = torch.randn(g["n_features"], d, dtype=torch.float64)
    cpu = torch.device("cpu")
    fitted = {}

    def fit():
        if fm is None:
            fitted["G"], _ = dp_merf.train_generator(mu, W, n_classes=n_classes, out_shape=(1, 16, 16), cfg=g,
                                                     generator=torch.Generator().manual_seed(0), device=cpu)
        else:
            fitted["G"], _ = fit_generator(matching_loss(fm, mu, n_classes, cpu), n_classes=n_classes,
                                           out_shape=(1, 16, 16), cfg=g, generator=torch.Generator().manual_seed(0),
                                           device=cpu)

    with one_thread():
        train = _peak(fit) + _held_bytes(fm)
        G = fitted["G"]
        sample = _peak(lambda: dp_merf.generate(G, cfg["baselines"]["n_samples"], generator=torch.Generator(),
                                                device=cpu), G) + _held_bytes(fm)
    plan = costs.embedding_memory(cfg, method)
    assert max(train, sample) <= plan.predicted_bytes - cost.GPU_RESERVE_BYTES
    # and not by much more than the training state the prediction counts at 20 bytes a parameter (Adam: 16)
    assert plan.predicted_bytes - cost.GPU_RESERVE_BYTES < 4 * max(train, sample)


def test_private_evolution_runs_the_public_denoiser_over_its_batch_and_the_clip_beside_it():
    cfg = config()
    plan = costs.pe_memory(cfg)
    unet = cost.pretrain_network(cfg)
    assert plan == cost.forward_memory("private_evolution", "edm_unet", unet, cfg["baselines"]["pe"]["batch_size"])
    larger = config(baselines={"pe": {"batch_size": 5000}})
    assert costs.pe_memory(larger).predicted_bytes > plan.predicted_bytes
    guided = costs.pe_memory(config(baselines={"pe": {"guidance": 1.0}}))
    assert guided.batch == 2 * plan.batch and guided.predicted_bytes > plan.predicted_bytes
    with_clip = costs.pe_memory(config(baselines={"pe": {"embedding": "clip"}}))
    clip = footprint.footprint("clip", costs.clip_network(cfg))
    assert with_clip.predicted_bytes >= plan.predicted_bytes + 4 * clip.params


def test_a_dp_sgd_baselines_samples_are_its_denoisers_forward_over_the_whole_set(tmp_path):
    w = Wiring(house(tmp_path))
    c = w.house.config
    n = c["baselines"]["n_samples"]
    plan = costs.sample_memory(c, w, "dp_diffusion_eps1_seed0")
    assert plan == cost.forward_memory("sample_baseline", "edm_unet", cost.pretrain_network(c), n)
    assert costs.sample_memory(c, w, "dp_ldm_eps1_seed0", "sample_dp_ldm") == cost.forward_memory(
        "sample_dp_ldm", "edm_unet", w.dpsgd_network("dp_ldm"), n)

    def more(cfg):
        cfg["baselines"]["n_samples"] = 10 * n

    def guided(cfg):
        cfg["baselines"].setdefault("privimage", {}).setdefault("sampler", {})["guidance"] = 1.0

    wm = Wiring(house(tmp_path, more))
    assert costs.sample_memory(wm.house.config, wm, "dp_diffusion_eps1_seed0").predicted_bytes > plan.predicted_bytes
    wg = Wiring(house(tmp_path, guided))
    assert costs.sample_memory(wg.house.config, wg, "privimage_eps1_seed0").batch == 2 * n
    # each job its own run's; a public denoiser the user brings is not counted
    res = w.resources("sample_baseline")
    assert res["gpu_mem_mb"](SimpleNamespace(run="dp_diffusion_eps1_seed0")) == plan.predicted_mb
    w.house.config["pretrain"]["source"] = "diffusers"
    assert "gpu_mem_mb" not in w.resources("sample_baseline") and "gpu_mem_mb" not in w.resources("private_evolution")
    assert callable(w.resources("sample_dp_ldm")["gpu_mem_mb"])


def test_privimage_s_query_net_holds_the_public_pool_and_its_batch_and_the_query_one_batch_of_scores():
    cfg = config()
    net = costs.query_net_network(cfg)
    assert net["n_classes"] == 2 * cost.PUBLIC_CLASSES_BOUND  # the public split's and the second domain's
    fp = footprint.footprint("evalnet", net)
    plan = costs.query_net_memory(cfg)
    assert plan.predicted_bytes >= cost.TRAIN_STATE_BYTES_PER_PARAM * fp.params + costs.pool_images(cfg) * (256 + 8)
    assert costs.pool_images(cfg) == cfg["data"]["public"]["n"] + cfg["straightdp"]["public"]["n"]
    larger = config(baselines={"privimage": {"query_net": {"batch_size": 4096}}})
    assert costs.query_net_memory(larger).predicted_bytes > plan.predicted_bytes
    more = config(data={"public": {"n": 500000}})
    assert costs.query_net_memory(more).predicted_bytes > plan.predicted_bytes
    assert costs.select_memory(cfg) == cost.forward_memory("privimage_select", "evalnet", net, costs.PREDICT_BATCH)
    wider = config(baselines={"privimage": {"query_net": {"width": 64}}})
    assert costs.select_memory(wider).predicted_bytes > costs.select_memory(cfg).predicted_bytes


def test_the_batches_the_models_assume_are_the_stages_defaults():
    from pipeline.evaluation.clip import ClipModel
    from pipeline.evaluation.evalnet import predict

    assert inspect.signature(ClipModel.image_features).parameters["batch_size"].default == costs.CLIP_EMBED_BATCH
    assert inspect.signature(predict).parameters["batch_size"].default == costs.PREDICT_BATCH


def test_every_gpu_rule_of_the_quick_tour_predicts_its_memory_within_the_declared_gpu(tmp_path):
    w = Wiring(house(tmp_path))
    limit = cost.gpu_mem_bytes(w.house.config) / 2**20
    for run in w.runs():
        rules = [w.sample_rules(run.method)[0]] if run.method in ("dp_diffusion", "privimage", "dp_ldm") else []
        rules += {"dp_merf": ["dp_merf"], "pe": ["private_evolution"], "privimage": ["privimage_select"]}.get(
            run.method, ["embedding_baseline"] if run.method in ("dp_hp", "dp_ntk", "dp_mepf") else [])
        for rule in rules:
            mb = w.resources(rule)["gpu_mem_mb"](SimpleNamespace(run=run.name))
            assert isinstance(mb, int) and 0 < mb < limit, (rule, run.name)
    assert 0 < w.resources("privimage_query_net")["gpu_mem_mb"](None) < limit
    assert np.isfinite(limit)
