"""pretrain_public: a seeded, deterministic EDM denoiser from the public split, with its provenance."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline.io import Split, manifest_path, read_json, save_split
from pipeline.models.checkpoint import load_denoiser, read_denoiser_meta
from pipeline.models.edm import EDMPrecond
from pipeline.models.unet import UNetSpec, build_unet
from pipeline.training.data import to_model_scale
from pipeline.training.pretrain import epoch_batches, fixed_draw_loss, pretrain_public, smoothed_curve

TINY = {"batch_size": 16, "lr": 2e-3, "ema_decay": 0.9,
        "unet": {"block_out_channels": [8, 16], "attention": [False, False], "norm_num_groups": 4}}


@pytest.fixture(scope="module")
def public_split(tmp_path_factory):
    # blobs whose position depends on the class: a learnable structure
    rng = np.random.default_rng(0)
    labels = np.arange(48) % 3
    yy, xx = np.mgrid[0:8, 0:8]
    images = np.stack([255 * np.exp(-((yy - 2 - 2 * c) ** 2 + (xx - 4) ** 2) / 3.0) for c in labels])
    images = np.clip(images + rng.normal(0, 10, images.shape), 0, 255).astype(np.uint8)[:, None]
    path = tmp_path_factory.mktemp("data") / "public.npz"
    save_split(path, Split(images, labels), name="public", source="test", seed=0)
    return path


def run(tmp, public, **pretrain):
    out = {"model": tmp / "models" / "public_edm.pt", "metrics": tmp / "train" / "metrics.json"}
    pretrain_public({"public": public}, out, {"pretrain": {**TINY, **pretrain}, "seed": 7, "config_id": "cfg",
                                              "device": "cpu"})
    return out


@pytest.fixture(scope="module")
def trained(public_split, tmp_path_factory):
    return run(tmp_path_factory.mktemp("a"), public_split, steps=30)


def test_model_file_records_the_public_data_and_the_run(trained, public_split):
    meta = read_denoiser_meta(trained["model"])
    assert meta["data_sha256"] == read_json(manifest_path(public_split))["sha256"]
    assert (meta["steps"], meta["seed"], meta["config_id"], meta["weights"]) == (30, 7, "cfg", "ema")
    assert meta["private"] is False
    metrics = json.loads(trained["metrics"].read_text())
    assert metrics["curve"]["step"][-1] == 30 and len(metrics["curve"]["loss"]) == 30
    assert np.isfinite(metrics["ema_eval_loss"])


def test_training_lowers_the_edm_loss(trained, public_split):
    spec = UNetSpec(image_size=8, block_out_channels=(8, 16), attention=(False, False), norm_num_groups=4,
                    num_classes=3)
    torch.manual_seed(7)  # the stage's own initialisation
    untrained = EDMPrecond(build_unet(spec))
    data = np.load(public_split)
    images, labels = torch.from_numpy(data["images"]), torch.from_numpy(data["labels"])
    kw = dict(p_mean=-1.2, p_std=1.2, sigma_data=0.5)
    before = fixed_draw_loss(untrained, images, labels, **kw)
    after = fixed_draw_loss(load_denoiser(trained["model"]), images, labels, **kw)
    assert after == pytest.approx(read_denoiser_meta(trained["model"])["ema_eval_loss"], rel=1e-5)
    assert after < 0.8 * before


def test_same_seed_gives_identical_weights(public_split, tmp_path):
    a = run(tmp_path / "x", public_split, steps=4)
    b = run(tmp_path / "y", public_split, steps=4)
    wa, wb = (torch.load(o["model"], weights_only=True)["state_dict"] for o in (a, b))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    c = run(tmp_path / "z", public_split, steps=4, lr=1e-3)
    wc = torch.load(c["model"], weights_only=True)["state_dict"]
    assert any(not torch.equal(wa[k], wc[k]) for k in wa)


def test_unconditional_model_has_no_class_embedding(public_split, tmp_path):
    out = run(tmp_path, public_split, steps=1, class_conditional=False)
    net = load_denoiser(out["model"])
    assert net.unet.class_embedding is None


def test_epochs_visit_every_image_once():
    seen = torch.cat([epoch_batches(10, 3, s, seed=0) for s in range(3)])  # 3 full batches per epoch
    assert len(set(seen.tolist())) == 9
    assert not torch.equal(epoch_batches(10, 3, 0, seed=0), epoch_batches(10, 3, 3, seed=0))  # next epoch reshuffles


def test_smoothed_curve_and_model_scale():
    c = smoothed_curve([float(i) for i in range(10)], points=5)
    assert c == {"step": [2, 4, 6, 8, 10], "loss": [0.5, 2.5, 4.5, 6.5, 8.5]}
    x = to_model_scale(np.array([0, 255], dtype=np.uint8))
    assert x.tolist() == [-1.0, 1.0]


@pytest.mark.parametrize("params,match", [({"sed": 1}, "unknown param 'sed'"),
                                          ({"pretrain": {"stpes": 3}}, "pretrain.stpes"),
                                          ({"pretrain": {"unet": {"image_size": 8}}}, "unknown key")])
def test_bad_params_are_one_line_errors(public_split, tmp_path, params, match):
    from pipeline.config import ConfigError
    from pipeline.stage import PipelineError

    with pytest.raises((PipelineError, ConfigError), match=match):
        pretrain_public({"public": public_split}, {"model": tmp_path / "m.pt", "metrics": tmp_path / "m.json"},
                        {"device": "cpu", **params})


def test_a_bf16_run_records_its_precision_and_learns_like_the_float32_one(trained, public_split, tmp_path):
    out = {"model": tmp_path / "m.pt", "metrics": tmp_path / "m.json"}
    pretrain_public({"public": public_split}, out, {"pretrain": {**TINY, "steps": 30}, "seed": 7, "config_id": "cfg",
                                                    "device": "cpu", "precision": "bf16"})
    meta, fp32 = read_denoiser_meta(out["model"]), read_denoiser_meta(trained["model"])
    assert meta["precision"] == "bf16" and "precision" not in fp32  # a float32 run writes what it wrote before
    assert meta["ema_eval_loss"] != fp32["ema_eval_loss"]
    assert meta["ema_eval_loss"] == pytest.approx(fp32["ema_eval_loss"], rel=0.25)
    model = load_denoiser(out["model"], device="cpu")
    assert all(p.dtype == torch.float32 for p in model.parameters())
