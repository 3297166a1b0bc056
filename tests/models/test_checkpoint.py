"""A denoiser file rebuilds the same function it was written from, or fails with one line."""

import pytest
import torch

from pipeline.models.checkpoint import load_denoiser, read_denoiser_meta, save_denoiser
from pipeline.models.edm import EDMPrecond
from pipeline.models.unet import UNetSpec, build_unet
from pipeline.stage import PipelineError


def test_round_trip_gives_the_same_denoiser(tmp_path):
    spec = UNetSpec(num_classes=10)
    torch.manual_seed(0)
    model = EDMPrecond(build_unet(spec), sigma_data=0.5).eval()
    save_denoiser(tmp_path / "d.pt", model, unet=spec, precond="edm", precond_kwargs={"sigma_data": 0.5},
                  meta={"stage": "test"})
    loaded = load_denoiser(tmp_path / "d.pt")
    x, labels = torch.randn(3, 1, 16, 16), torch.tensor([0, 4, 10])
    with torch.no_grad():
        assert torch.equal(model(x, 0.7, labels), loaded(x, 0.7, labels))
    assert read_denoiser_meta(tmp_path / "d.pt") == {"stage": "test"}
    assert not loaded.training


def test_unet_spec_json_round_trip_and_errors():
    spec = UNetSpec(block_out_channels=(32, 64, 64), attention=(False, True, True), image_size=32)
    assert UNetSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="one entry per resolution level"):
        UNetSpec(attention=(True,))
    with pytest.raises(ValueError, match="unknown key 'widht'"):
        UNetSpec.from_json({"widht": 3})


def test_missing_or_foreign_file_is_one_line(tmp_path):
    with pytest.raises(PipelineError, match="no denoiser file"):
        load_denoiser(tmp_path / "nope.pt")
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(PipelineError, match="not a dpgen-denoiser/1 file"):
        load_denoiser(tmp_path / "other.pt")
