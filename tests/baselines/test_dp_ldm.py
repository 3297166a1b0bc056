"""Stage dp_ldm_decode: DP-LDM's sampled codes become images under the public decoder (post-processing), with their
labels and the latents' provenance; codes of another shape, or an autoencoder that saw private data, are refused."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.baselines.dp_ldm import decode_codes, dp_ldm_decode
from pipeline.flow import autoencoder as ae
from pipeline.io import Split, load_split, read_manifest, save_split
from pipeline.stage import PipelineError
from pipeline.training.data import to_model_scale


@pytest.fixture()
def model(tmp_path):
    """An (untrained) 16 x 16 autoencoder with 4 code channels, saved as a public one."""
    spec = ae.AutoencoderSpec(code_channels=4, width=8)
    net = ae.ConvAutoencoder(spec).eval().requires_grad_(False)
    ae.save(tmp_path / "ae.pt", net, {"private": False, "public_sha256": "abc"})
    return net


def codes(n: int = 6, shape: tuple[int, ...] = (4, 4, 4)) -> Split:
    rng = np.random.default_rng(0)
    return Split(rng.integers(0, 256, (n, *shape), dtype=np.uint8), np.arange(n) % 3)


def test_the_samples_are_the_decoded_codes_with_their_labels_and_provenance(tmp_path, model):
    save_split(tmp_path / "lat.npz", codes(), name="latents", source="sample_dpdm", seed=7,
               extra={"sampler": {"name": "edm"}, "nfe": 23, "denoiser_meta": {"private": True}})
    dp_ldm_decode({"latents": tmp_path / "lat.npz", "autoencoder": tmp_path / "ae.pt"},
                  {"samples": tmp_path / "s.npz"}, {"name": "baselines/dp_ldm_eps1_seed0"})
    out = load_split(tmp_path / "s.npz")
    assert out.images.shape == (6, 1, 16, 16) and out.images.dtype == np.uint8
    assert np.array_equal(out.labels, codes().labels)
    assert np.array_equal(out.images, ae.decode(ae.load(tmp_path / "ae.pt"), to_model_scale(codes().images)))
    manifest = read_manifest(tmp_path / "s.npz")
    assert manifest["seed"] == 7 and manifest["nfe"] == 23 and manifest["denoiser_meta"] == {"private": True}
    assert manifest["latents_sha256"] == read_manifest(tmp_path / "lat.npz")["sha256"]
    assert manifest["autoencoder_public_sha256"] == "abc" and manifest["split"] == "baselines/dp_ldm_eps1_seed0"


def test_codes_of_another_shape_are_a_one_line_error(model):
    with pytest.raises(PipelineError, match=r"^input latents: codes are \[2, 4, 4\], the autoencoder decodes "
                                            r"\[4, 4, 4\]"):
        decode_codes(model, codes(shape=(2, 4, 4)))


def test_an_autoencoder_not_marked_public_is_refused(tmp_path, model):
    ae.save(tmp_path / "private_ae.pt", model, {"private": True})
    save_split(tmp_path / "lat.npz", codes(), name="latents", source="test", seed=0)
    with pytest.raises(PipelineError, match="not marked public"):
        dp_ldm_decode({"latents": tmp_path / "lat.npz", "autoencoder": tmp_path / "private_ae.pt"},
                      {"samples": tmp_path / "s.npz"}, {})
