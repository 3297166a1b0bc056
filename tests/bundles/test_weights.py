"""A bundle's weights: safetensors in diffusers' layout, rebuilt to the house model file's network tensor for tensor,
never a pickle."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline.bundles.weights import diffusers_parts, export_weights, load_weights
from pipeline.flow.backbone import FLOW_PRECOND, FlowSpec, build_flow_model
from pipeline.models.checkpoint import load_denoiser, save_denoiser
from pipeline.models.edm import EDMPrecond
from pipeline.models.unet import UNetSpec, build_unet
from pipeline.stage import PipelineError

UNET = UNetSpec(image_size=8, block_out_channels=(8, 16), attention=(False, False), norm_num_groups=4, num_classes=3)
FLOW = FlowSpec(image_size=8, channels=1, patch_size=2, num_layers=1, attention_head_dim=8, num_attention_heads=2,
                joint_attention_dim=8, caption_projection_dim=16, pooled_projection_dim=8, pos_embed_max_size=4,
                num_classes=3)


@pytest.fixture(params=["dpdm_unet", "straightdp_flow"])
def model_file(request, tmp_path):
    torch.manual_seed(3)
    path = tmp_path / "model.pt"
    if request.param == "dpdm_unet":
        save_denoiser(path, EDMPrecond(build_unet(UNET)), unet=UNET, precond="edm", meta={"seed": 0})
    else:
        save_denoiser(path, build_flow_model(FLOW), backbone=FLOW, precond=FLOW_PRECOND, meta={"seed": 0})
    return path


def test_exported_weights_rebuild_the_model_files_network_tensor_for_tensor(model_file, tmp_path):
    spec = export_weights(model_file, tmp_path / "weights")
    rebuilt, read = load_weights(tmp_path / "weights")
    original = load_denoiser(model_file)
    assert read == spec and type(rebuilt) is type(original)
    a, b = original.state_dict(), rebuilt.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not list((tmp_path / "weights").rglob("*.pt")) and not list((tmp_path / "weights").rglob("*.bin"))


def test_the_diffusers_part_loads_with_diffusers_alone(model_file, tmp_path):
    spec = export_weights(model_file, tmp_path / "weights")
    original = load_denoiser(model_file)
    (name,) = spec["diffusers"]
    part = diffusers_parts(original)[name]
    loaded = type(part).from_pretrained(tmp_path / "weights" / name, local_files_only=True)
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in part.state_dict().items())


def test_weights_that_do_not_fit_the_described_network_are_one_line(model_file, tmp_path):
    export_weights(model_file, tmp_path / "weights")
    described = json.loads((tmp_path / "weights" / "denoiser.json").read_text())
    described["spec"]["num_classes"] = 5  # another label table than the weights'
    (tmp_path / "weights" / "denoiser.json").write_text(json.dumps(described))
    with pytest.raises(PipelineError, match="do not fit the network"):
        load_weights(tmp_path / "weights")


def test_a_pickle_in_place_of_the_weights_is_not_opened(model_file, tmp_path):
    spec = export_weights(model_file, tmp_path / "weights")
    folder = tmp_path / "weights" / spec["diffusers"][0]
    for f in folder.glob("*.safetensors"):
        f.unlink()
    torch.save({"x": torch.zeros(1)}, folder / "diffusion_pytorch_model.bin")
    with pytest.raises(PipelineError, match="no .safetensors weights"):
        load_weights(tmp_path / "weights")


def test_the_public_autoencoder_travels_as_safetensors_and_decodes_as_the_house_file_does(tmp_path):
    from pipeline.bundles.weights import AUTOENCODER_FILE, export_autoencoder, load_autoencoder
    from pipeline.flow import autoencoder

    torch.manual_seed(0)
    ae = autoencoder.ConvAutoencoder(autoencoder.AutoencoderSpec(image_size=8, channels=1, code_channels=2, width=4))
    autoencoder.save(tmp_path / "ae.pt", ae, {"mse": 0.25})
    described = export_autoencoder(tmp_path / "ae.pt", tmp_path / "bundle")
    assert described["meta"] == {"mse": 0.25} and (tmp_path / "bundle" / AUTOENCODER_FILE).is_file()
    again = load_autoencoder(tmp_path / "bundle")
    codes = torch.rand(5, 2, 2, 2) * 2 - 1
    assert np.array_equal(autoencoder.decode(again, codes), autoencoder.decode(autoencoder.load(tmp_path / "ae.pt"),
                                                                                codes))
    spec = json.loads((tmp_path / "bundle" / "autoencoder.json").read_text())
    (tmp_path / "bundle" / "autoencoder.json").write_text(json.dumps({**spec, "spec": {**spec["spec"], "width": 8}}))
    with pytest.raises(PipelineError, match="do not fit autoencoder.json"):
        load_autoencoder(tmp_path / "bundle")
