"""pipeline.footprint: the saved bytes and FLOPs per example of a network's training step, counted on the meta device."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline import footprint
from pipeline.models.edm import EDMPrecond
from pipeline.models.unet import UNetSpec, build_unet

TINY = {"unet": {"block_out_channels": [8, 16], "attention": [False, True], "layers_per_block": 1,
                 "norm_num_groups": 4, "image_size": 8, "channels": 3, "num_classes": 10}}


def _saved_on_cpu(spec: dict, b: int, kind: str = "edm_unet") -> int:
    """Bytes autograd really keeps for a batch of ``b`` on the CPU (each storage once, parameters left out)."""
    torch.manual_seed(0)
    model, loss_of = footprint.BUILDERS[kind](spec)
    held = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in held:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_of(b)
    return sum(storages.values())


def test_the_flow_s_meta_count_is_what_autograd_keeps_on_the_cpu_or_a_little_more():
    from pipeline.config import schema_defaults

    spec = {"flow": schema_defaults("straightdp", "flow"), "shape": [1, 16, 16], "num_classes": 10}
    fp = footprint.count("flow_mmdit", spec)
    per_example = _saved_on_cpu(spec, 4, "flow_mmdit") - _saved_on_cpu(spec, 3, "flow_mmdit")
    # within 2% below (one 1 KiB tensor the CPU kernels keep per example) to 10% above
    assert 0.98 * per_example <= fp.saved_bytes_per_example <= 1.1 * per_example


def test_the_meta_count_is_what_autograd_keeps_on_a_real_device_or_a_little_more():
    fp = footprint.count("edm_unet", TINY)
    per_example = _saved_on_cpu(TINY, 4) - _saved_on_cpu(TINY, 3)
    # the meta kernels keep a few small tensors the CPU's do not: the count errs on the safe side, by little
    # within 2% below (one 1 KiB tensor the CPU kernels keep per example) to 10% above
    assert 0.98 * per_example <= fp.saved_bytes_per_example <= 1.1 * per_example
    assert _saved_on_cpu(TINY, 64) <= fp.activation_bytes(64) <= 1.1 * _saved_on_cpu(TINY, 64)
    model = EDMPrecond(build_unet(UNetSpec.from_json(TINY["unet"])), sigma_data=0.5)
    assert fp.params == sum(p.numel() for p in model.parameters())
    # a training step costs about three forward passes (the backward two)
    assert 2.5 < fp.train_flops_per_example / fp.forward_flops_per_example < 3.5


def test_a_wider_network_or_larger_images_keep_more_per_example():
    base = footprint.count("edm_unet", TINY)
    wide = footprint.count("edm_unet", {"unet": {**TINY["unet"], "block_out_channels": [16, 32], "norm_num_groups": 8}})
    large = footprint.count("edm_unet", {"unet": {**TINY["unet"], "image_size": 16}})
    assert wide.saved_bytes_per_example > 1.8 * base.saved_bytes_per_example
    assert large.saved_bytes_per_example > 3.5 * base.saved_bytes_per_example  # 4x the pixels


def test_a_count_is_kept_by_its_workload_hash_and_read_back(tmp_path, monkeypatch):
    cache = tmp_path / "footprints.json"
    monkeypatch.setenv("DPGEN_FOOTPRINT_CACHE", str(cache))
    spec = {"unet": {**TINY["unet"], "num_classes": 3}}
    first = footprint.footprint("edm_unet", spec)
    key = footprint.workload_key("edm_unet", spec)
    assert footprint.read_cache(cache) == {key: first}
    footprint._footprint.cache_clear()
    monkeypatch.setattr(footprint, "count", lambda *a: pytest.fail("a cached workload is counted again"))
    assert footprint.footprint("edm_unet", spec) == first
    assert footprint.workload_key("edm_unet", spec) != footprint.workload_key("edm_unet", TINY)


def test_the_repository_file_holds_fresh_counts():
    """pipeline/footprints.json is what the cost models read for the embedded default and every preset: each entry is
    recounted here, so a change to a network's code that moves its footprint cannot leave the file stale."""
    blob = json.loads(footprint.CACHE_FILE.read_text())
    assert blob["format"] == footprint.FORMAT and blob["workloads"]
    for key, entry in blob["workloads"].items():
        kind = key.split(":")[0]
        assert footprint.workload_key(kind, entry["spec"]) == key
        fresh = footprint.count(kind, entry["spec"])
        for field, value in entry["footprint"].items():
            assert getattr(fresh, field) == pytest.approx(value, rel=1e-9), (key, field)


def test_the_evaluation_cnn_s_forward_flops_are_its_layers_multiply_adds():
    """EvalNet (pipeline/evaluation/evalnet.py): two 3x3 convolutions, each followed by a 2x2 max-pool, an adaptive
    average pool to POOLED_SIDE, a linear map to the features and the class head: 2 FLOPs per multiply-add."""
    from pipeline.evaluation.evalnet import POOLED_SIDE

    c, side, w, fd, k = 3, 32, 8, 16, 10
    fp = footprint.count("evalnet", {"shape": [c, side, side], "n_classes": k, "width": w, "feature_dim": fd})
    macs = (c * w * 9 * side**2 + w * 2 * w * 9 * (side // 2) ** 2 + 2 * w * POOLED_SIDE**2 * fd + fd * k)
    assert fp.forward_flops_per_example == 2 * macs
    assert 2.5 * fp.forward_flops_per_example < fp.train_flops_per_example <= 3 * fp.forward_flops_per_example


def test_inception_is_counted_at_its_own_299_pixels_whatever_the_image_side():
    small = footprint.count("inception_v3", {"shape": [3, 16, 16]})
    large = footprint.count("inception_v3", {"shape": [3, 64, 64]})
    assert 10e9 < small.forward_flops_per_example < 13e9  # ~5.7 GMAC (Szegedy et al. 2016, Table 3)
    assert large.forward_flops_per_example == pytest.approx(small.forward_flops_per_example, rel=1e-3)
    assert small.train_flops_per_example == 0 and small.saved_bytes_per_example == 0  # never trained here


def _forward_peak_on_cpu(spec: dict, b: int) -> float:
    """The live activations' peak of a gradient-free forward of ``b`` examples on the CPU, by the same tracker."""
    torch.manual_seed(0)
    model, loss_of = footprint.BUILDERS["edm_unet"](spec)
    return footprint._forward_peak(model, lambda: loss_of(b))


def test_a_gradient_free_forward_peaks_below_what_training_keeps_and_the_meta_count_is_the_cpus():
    fp = footprint.count("edm_unet", TINY)
    per_example = _forward_peak_on_cpu(TINY, 4) - _forward_peak_on_cpu(TINY, 3)
    # the meta device's count is what the CPU's allocations peak at
    assert fp.forward_peak_bytes_per_example == pytest.approx(per_example, rel=0.05)
    assert fp.forward_peak_bytes(16) == pytest.approx(_forward_peak_on_cpu(TINY, 16), rel=0.05)
    # sampling frees each layer's input once its output exists: far less than the training step's saved tensors
    assert 0 < fp.forward_peak_bytes_per_example < 0.6 * fp.saved_bytes_per_example
