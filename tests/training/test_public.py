"""A public denoiser the user brings (pretrain.source: diffusers): a local UNet2DModel folder becomes the denoiser file.

The folders are tiny models the tests write with diffusers' own ``save_pretrained``; nothing is downloaded.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from pipeline.config import ConfigError, validate_config
from pipeline.inputs import check_inputs_exist
from pipeline.io import Split, read_json, save_split
from pipeline.models.checkpoint import load_denoiser, read_denoiser_backbone, read_denoiser_meta
from pipeline.models.edm import EDMPrecond
from pipeline.models.precond import VPPrecond
from pipeline.training.public import folder_sha256, import_public
from pipeline.stage import PipelineError
from pipeline.wiring import House
from tests import public_models

N_CLASSES = 3


def save_unet(folder, **kwargs):
    return public_models.save_unet(folder, **{"num_class_embeds": N_CLASSES + 1, **kwargs})


@pytest.fixture(scope="module")
def public_split(tmp_path_factory):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (12, 1, 8, 8), dtype=np.uint8)
    path = tmp_path_factory.mktemp("data") / "public.npz"
    save_split(path, Split(images, np.arange(12) % N_CLASSES), name="public", source="test", seed=0)
    return path


def run(tmp, public, folder, *, planned=None, **pretrain):
    out = {"model": tmp / "models" / "public_edm.pt", "metrics": tmp / "train" / "metrics.json"}
    params = {"pretrain": {"source": "diffusers", "path": str(folder), "sigma_data": 0.5, **pretrain},
              "config_id": "cfg"}
    if planned is not None:
        params["public_model"] = {"source": "diffusers", "sha256": planned}
    import_public({"public": public}, out, params)
    return out


def test_the_imported_file_denoises_exactly_as_the_users_model_in_the_declared_preconditioning(public_split, tmp_path):
    unet = save_unet(tmp_path / "ours")
    out = run(tmp_path, public_split, tmp_path / "ours", planned=folder_sha256(tmp_path / "ours"))
    loaded = load_denoiser(out["model"], convention="ve_sigma")
    x, sigma, labels = torch.randn(4, 1, 8, 8), torch.tensor([0.01, 0.3, 2.0, 40.0]), torch.tensor([0, 1, 2, 3])
    with torch.no_grad():
        assert torch.equal(loaded(x, sigma, labels), EDMPrecond(unet.eval(), sigma_data=0.5)(x, sigma, labels))
    kind, spec = read_denoiser_backbone(out["model"])
    assert kind == "diffusers_unet" and spec.config["num_class_embeds"] == N_CLASSES + 1
    meta = read_denoiser_meta(out["model"])
    assert meta["sha256"] == folder_sha256(tmp_path / "ours") and meta["source"] == "diffusers"
    assert meta["private"] is False and meta["precond"] == "edm"
    assert read_json(out["metrics"])["sha256"] == meta["sha256"]


def test_a_ddpm_epsilon_model_is_read_with_vp_preconditioning(public_split, tmp_path):
    unet = save_unet(tmp_path / "ddpm", num_class_embeds=None)
    out = run(tmp_path, public_split, tmp_path / "ddpm", precond="vp")
    x, sigma = torch.randn(2, 1, 8, 8), torch.tensor([0.5, 5.0])
    with torch.no_grad():
        assert torch.equal(load_denoiser(out["model"])(x, sigma), VPPrecond(unet.eval())(x, sigma))


def test_the_hash_covers_every_file_and_a_model_changed_after_planning_is_refused(public_split, tmp_path):
    save_unet(tmp_path / "m")
    before = folder_sha256(tmp_path / "m")
    save_unet(tmp_path / "m", seed=1)  # same config, other weights
    assert folder_sha256(tmp_path / "m") != before
    with pytest.raises(PipelineError, match="changed since the DAG was planned"):
        run(tmp_path, public_split, tmp_path / "m", planned=before)


@pytest.mark.parametrize("kwargs, match", [
    ({"sample_size": 16}, "is a 16-pixel model, the data are 8x8"),
    ({"channels": 3}, "maps 3 to 3 channels, the data have 1"),
    ({"num_class_embeds": 10}, r"has 10 class embeddings, expected 4 \(the public set's 3 classes and the null"),
])
def test_a_model_of_another_shape_or_label_count_is_one_line_naming_the_key(public_split, tmp_path, kwargs, match):
    save_unet(tmp_path / "m", **kwargs)
    with pytest.raises(PipelineError, match=match) as err:
        run(tmp_path, public_split, tmp_path / "m")
    assert str(err.value).startswith("config error at pretrain.path: ") and "\n" not in str(err.value)


def test_a_folder_of_another_class_or_no_folder_is_one_line(public_split, tmp_path):
    from diffusers import AutoencoderKL

    AutoencoderKL(block_out_channels=(8,), norm_num_groups=4, latent_channels=2).save_pretrained(tmp_path / "vae")
    with pytest.raises(PipelineError, match="holds a AutoencoderKL, expected a diffusers UNet2DModel"):
        run(tmp_path, public_split, tmp_path / "vae")
    with pytest.raises(PipelineError, match="is not a folder: expected a local diffusers UNet2DModel folder"):
        run(tmp_path, public_split, tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PipelineError, match="has no config.json"):
        run(tmp_path, public_split, tmp_path / "empty")
    save_unet(tmp_path / "noweights")
    for f in (tmp_path / "noweights").glob("*.safetensors"):
        os.remove(f)
    with pytest.raises(PipelineError, match="diffusers cannot load"):
        run(tmp_path, public_split, tmp_path / "noweights")


def _config(tmp_path, **pretrain):
    return validate_config({"data": {"image_size": 8}, "results_dir": str(tmp_path / "results"),
                            "pretrain": {"source": "diffusers", **pretrain}})


def test_config_checks_the_folder_before_any_job_is_scheduled(tmp_path):
    with pytest.raises(ConfigError, match="^config error at pretrain.path: pretrain.source diffusers needs the path"):
        check_inputs_exist(_config(tmp_path))
    save_unet(tmp_path / "big", sample_size=16)
    with pytest.raises(ConfigError, match="^config error at pretrain.path: .* is a 16-pixel model, the data are 8x8"):
        check_inputs_exist(_config(tmp_path, path=str(tmp_path / "big")))
    save_unet(tmp_path / "ok")
    check_inputs_exist(_config(tmp_path, path=str(tmp_path / "ok")))
    config = json.loads((tmp_path / "ok" / "config.json").read_text())
    (tmp_path / "ok" / "config.json").write_text(json.dumps({**config, "_class_name": "UNet2DConditionModel"}))
    with pytest.raises(ConfigError, match="holds a UNet2DConditionModel, expected a diffusers UNet2DModel"):
        check_inputs_exist(_config(tmp_path, path=str(tmp_path / "ok")))


def test_the_models_hash_is_in_the_config_id_of_every_run_that_reads_it_and_a_trained_one_changes_nothing(tmp_path):
    from pipeline.methods.dpdm.wiring import Wiring as DpdmWiring
    from pipeline.methods.empden.wiring import Wiring as EmpdenWiring

    def ids(cfg):
        house = House.from_config(cfg)
        empden, dpdm = EmpdenWiring(house), DpdmWiring(house)
        cell = {"p": "55", "B": "25", "T": "3", "beta": "1", "seed": "0"}
        run = next(r for r in dpdm.runs() if dpdm.init_of(r.parameterisation) == "public")
        return {"empden": json.loads(empden.sample_params("hybrid", cell))["config_id"],
                "dpdm": json.loads(dpdm.train_params(type("W", (), {"run": run.name})))["config_id"],
                "import": json.loads(house.public_denoiser_params())["config_id"]}

    trained = validate_config({"results_dir": str(tmp_path / "r")})
    assert House.from_config(trained).public_model() == {}
    assert "public_model" not in json.loads(EmpdenWiring(House.from_config(trained)).sample_params(
        "hybrid", {"p": "55", "B": "25", "T": "3", "beta": "1", "seed": "0"}))
    save_unet(tmp_path / "m", sample_size=16)
    first = ids(validate_config({"results_dir": str(tmp_path / "r"), "pretrain": {"source": "diffusers",
                                                                                  "path": str(tmp_path / "m")}}))
    save_unet(tmp_path / "m", sample_size=16, seed=1)
    second = ids(validate_config({"results_dir": str(tmp_path / "r"), "pretrain": {"source": "diffusers",
                                                                                   "path": str(tmp_path / "m")}}))
    assert all(first[k] != second[k] for k in first), (first, second)
