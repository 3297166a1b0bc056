"""The latent variant's public autoencoder (pipeline/flow/autoencoder.py): d = 32 codes, 8-bit code splits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.flow import autoencoder as ae
from pipeline.io import Split, load_split, read_json, save_split
from pipeline.stage import PipelineError
from pipeline.training.data import to_model_scale


def blobs(n: int, seed: int) -> Split:
    """16 x 16 images of one bright square at a random place: simple enough to learn in a few steps."""
    rng = np.random.default_rng(seed)
    images = np.zeros((n, 1, 16, 16), dtype=np.uint8)
    for i, (r, c) in enumerate(rng.integers(0, 12, size=(n, 2))):
        images[i, 0, r:r + 4, c:c + 4] = 255
    return Split(images, rng.integers(0, 3, size=n))


def test_the_paper_code_is_32_dimensional_at_16_by_16():
    spec = ae.AutoencoderSpec()
    assert spec.code_shape == (2, 4, 4) and spec.code_dim == 32
    codes = ae.encode(ae.ConvAutoencoder(spec), blobs(5, 0).images)
    assert codes.shape == (5, 2, 4, 4) and codes.abs().max() < 1
    with pytest.raises(ValueError, match="multiple of 4"):
        ae.AutoencoderSpec(image_size=18)


def test_training_on_public_images_lowers_the_reconstruction_error():
    public, spec = blobs(200, 1), ae.AutoencoderSpec(width=8)
    untrained = ae.ConvAutoencoder(spec)
    model, losses = ae.train(public.images, spec, steps=60, batch_size=64, lr=5e-3, seed=0)
    assert not any(p.requires_grad for p in model.parameters())  # frozen: nothing downstream trains it
    assert ae.mse(model, blobs(100, 2).images) < 0.5 * ae.mse(untrained, blobs(100, 2).images)
    assert np.mean(losses[-10:]) < np.mean(losses[:10])


def test_stages_train_on_public_only_and_write_codes_as_an_8_bit_split(tmp_path):
    save_split(tmp_path / "public.npz", blobs(120, 3), name="public", source="test", seed=3)
    save_split(tmp_path / "private.npz", blobs(30, 4), name="private", source="test", seed=4)
    out = {"model": tmp_path / "ae.pt", "metrics": tmp_path / "m.json"}
    ae.train_autoencoder({"public": tmp_path / "public.npz"}, out, {"autoencoder": {"steps": 20}, "seed": 0})
    metrics = read_json(out["metrics"])
    assert metrics["private"] is False and metrics["code_dim"] == 32 and metrics["steps"] == 20
    ae.encode_split({"split": tmp_path / "private.npz", "autoencoder": out["model"]}, {"codes": tmp_path / "c.npz"},
                    {})
    codes = load_split(tmp_path / "c.npz")
    assert codes.images.shape == (30, 2, 4, 4) and codes.images.dtype == np.uint8
    assert np.array_equal(codes.labels, blobs(30, 4).labels)
    exact = ae.encode(ae.load(out["model"]), blobs(30, 4).images)
    assert torch.max(torch.abs(to_model_scale(codes.images) - exact)) <= 1 / 255 + 1e-6  # 8-bit rounding only
    assert ae.decode(ae.load(out["model"]), to_model_scale(codes.images)).shape == (30, 1, 16, 16)


def test_bad_inputs_are_one_line(tmp_path):
    (tmp_path / "x.pt").write_bytes(b"not a model")
    with pytest.raises(PipelineError, match="^input autoencoder: cannot read"):
        ae.load(tmp_path / "x.pt")
    torch.save({"format": "other"}, tmp_path / "y.pt")
    with pytest.raises(PipelineError, match="is not a dpgen-autoencoder/1 file"):
        ae.load(tmp_path / "y.pt")
    model = ae.ConvAutoencoder(ae.AutoencoderSpec())
    ae.save(tmp_path / "ae.pt", model, {})
    save_split(tmp_path / "big.npz", Split(np.zeros((2, 1, 8, 8), np.uint8), np.zeros(2, np.int64)), name="b",
               source="test", seed=0)
    with pytest.raises(PipelineError, match=r"^input split: images are \[1, 8, 8\]"):
        ae.encode_split({"split": tmp_path / "big.npz", "autoencoder": tmp_path / "ae.pt"},
                        {"codes": tmp_path / "c.npz"}, {})
