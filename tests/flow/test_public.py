"""STRAIGHTDP's public flow the user brings (straightdp.pretrain.source: diffusers, pipeline/flow/public.py): a local
SD3Transformer2DModel folder and its label embeddings become the flow file every STRAIGHTDP reader uses.

The folders are tiny models written by diffusers' own ``save_pretrained``; nothing is downloaded.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import yaml

from pipeline.config import ConfigError, deep_merge, validate_config
from pipeline.methods.straightdp import stages as sdp
from pipeline.flow.backbone import FlowSpec
from pipeline.flow.public import import_straightdp, public_model
from pipeline.inputs import check_inputs_exist
from pipeline.io import Split, save_split
from pipeline.models.checkpoint import load_denoiser, read_denoiser_backbone, read_denoiser_meta
from pipeline.stage import PipelineError
from tests.public_models import save_label_tables, save_sd3, save_unet

N_CLASSES = 3
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def public_split(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("data") / "public.npz"
    save_split(path, Split(rng.integers(0, 256, (12, 1, 8, 8), dtype=np.uint8), np.arange(12) % 5), name="public",
               source="test", seed=0)
    return path


@pytest.fixture
def user_model(tmp_path):
    """The user's files: a 2-block SD3 transformer at 8x8 grey and random caption/pooled tables of 3 classes."""
    transformer = save_sd3(tmp_path / "sd3")
    caption, pooled = save_label_tables(tmp_path / "labels.safetensors", n_classes=N_CLASSES)
    return {"transformer": transformer.eval(), "caption": caption, "pooled": pooled,
            "pretrain": {"source": "diffusers", "path": str(tmp_path / "sd3"),
                         "label_embeddings": str(tmp_path / "labels.safetensors")}}


def run(tmp, public, pretrain, *, planned=None, n_classes=N_CLASSES):
    out = {"model": tmp / "models" / "public_flow.pt"}
    params = {"straightdp": {"pretrain": pretrain}, "n_classes": n_classes, "config_id": "cfg"}
    if planned is not None:
        params["public_model"] = planned
    import_straightdp({"public": public}, out, params)
    return out["model"]


def sd3_velocity(m, x, t, y):
    """What SD3 itself outputs for class ``y``'s caption at our time t (its sigma = 1 - t), negated: z - xi."""
    with torch.no_grad():
        return -m["transformer"](x, encoder_hidden_states=m["caption"][y], pooled_projections=m["pooled"][y],
                                 timestep=1000 * (1 - t), return_dict=False)[0]


def test_the_imported_flow_is_the_users_sd3_conditioned_on_the_class_captions(public_split, tmp_path, user_model):
    path = run(tmp_path, public_split, user_model["pretrain"], planned=public_model(user_model["pretrain"]))
    flow = load_denoiser(path, convention="rectified_flow_t")
    x, t, y = torch.randn(4, 1, 8, 8), torch.tensor([0.0, 0.2, 0.7, 1.0]), torch.tensor([0, 1, 2, 3])
    with torch.no_grad():
        ours = flow(x, t, y)
        null = flow(x, t)  # no label: the null caption (row K)
    assert torch.allclose(ours, sd3_velocity(user_model, x, t, y), atol=1e-6)
    assert torch.allclose(null, sd3_velocity(user_model, x, t, torch.full((4,), N_CLASSES)), atol=1e-6)
    kind, spec = read_denoiser_backbone(path)
    assert kind == "sd3_transformer" and spec.num_classes == N_CLASSES and spec.caption_tokens == 3
    assert not spec.constrained
    meta = read_denoiser_meta(path)
    assert meta["private"] is False and meta["prediction"] == "noise_minus_data"
    assert meta["sha256"] == public_model(user_model["pretrain"])["sha256"]


def test_a_flow_trained_as_ours_is_read_without_the_sign_flip(public_split, tmp_path, user_model):
    path = run(tmp_path, public_split, {**user_model["pretrain"], "prediction": "data_minus_noise"})
    x, t, y = torch.randn(2, 1, 8, 8), torch.tensor([0.3, 0.9]), torch.tensor([1, 2])
    with torch.no_grad():
        assert torch.allclose(load_denoiser(path)(x, t, y), -sd3_velocity(user_model, x, t, y), atol=1e-6)


def test_an_sd35_style_transformer_with_qk_norm_and_dual_attention_loads(public_split, tmp_path):
    m = {"transformer": save_sd3(tmp_path / "sd35", qk_norm="rms_norm", dual_attention_layers=(0,)).eval()}
    m["caption"], m["pooled"] = save_label_tables(tmp_path / "l.safetensors", n_classes=N_CLASSES)
    path = run(tmp_path, public_split, {"source": "diffusers", "path": str(tmp_path / "sd35"),
                                        "label_embeddings": str(tmp_path / "l.safetensors")})
    _, spec = read_denoiser_backbone(path)
    assert spec.qk_norm == "rms_norm" and spec.dual_attention_layers == (0,)
    assert FlowSpec.from_json(spec.to_json()) == spec
    x, t, y = torch.randn(2, 1, 8, 8), torch.tensor([0.1, 0.6]), torch.tensor([0, 2])
    with torch.no_grad():
        assert torch.allclose(load_denoiser(path)(x, t, y), sd3_velocity(m, x, t, y), atol=1e-6)


def test_a_flow_trained_here_keeps_its_file_format():
    spec = FlowSpec()
    assert "qk_norm" not in spec.to_json() and "dual_attention_layers" not in spec.to_json()
    assert sdp.build_flow_model(spec).precond_kwargs() == {}


def test_dp_lora_on_the_imported_flow_keeps_its_prediction_in_the_trained_file(public_split, tmp_path, user_model):
    from tests.methods.straightdp.test_stages import BINDING, PRIVATE, TINY, blobs

    init = run(tmp_path, public_split, user_model["pretrain"])
    paths = {"data": tmp_path / "private.npz", "public": tmp_path / "pub.npz", "geometry": tmp_path / "g.npz",
             "horizon": tmp_path / "h.json", "init": init}
    save_split(paths["data"], blobs(150, 3, 0), name="train", source="test", seed=0)
    save_split(paths["public"], blobs(120, 3, 1), name="public", source="test", seed=0)
    sdp.straightdp_geometry({"public": paths["public"]}, {k: paths[k] for k in ("geometry", "horizon")},
                            {"straightdp": TINY})
    out = {"model": tmp_path / "lora.pt", "ledger": tmp_path / "lora.jsonl", "metrics": tmp_path / "lora.json"}
    sdp.train_straightdp(paths, out, {"straightdp": TINY, "run": "lora_uniform_eps1_seed0", "private": PRIVATE,
                                      "ledger_binding": BINDING, "device": "cpu"})
    trained = load_denoiser(out["model"])
    assert trained.prediction == "noise_minus_data"
    # three DP-LoRA steps move the adapters a little: the merged flow stays close to the import, not its negation
    x, t, y = torch.randn(4, 1, 8, 8), torch.full((4,), 0.5), torch.tensor([0, 1, 2, 0])
    with torch.no_grad():
        before, after = load_denoiser(init)(x, t, y), trained(x, t, y)
    assert (after - before).norm() < 0.5 * before.norm()


@pytest.mark.parametrize("kwargs, match", [
    ({"channels": 3}, r"^config error at straightdp.pretrain.path: .* maps 3 to 3 channels, the flow's data have 1$"),
    ({"patch_size": 3}, r"has patch size 3, which does not divide the flow's 8x8 inputs"),
    ({"pos_embed_max_size": 2}, r"positional table is 2 patches wide, the flow's 8x8 inputs are 4 patches of 2"),
    ({"pos_embed_max_size": None}, r"has no pos_embed_max_size"),
])
def test_a_transformer_of_another_shape_is_one_line_naming_the_key(public_split, tmp_path, user_model, kwargs, match):
    save_sd3(tmp_path / "other", **kwargs)
    with pytest.raises(PipelineError, match=match) as err:
        run(tmp_path, public_split, {**user_model["pretrain"], "path": str(tmp_path / "other")})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kwargs, match", [
    ({"n_classes": 9}, r"has caption \[10, 3, 8\], expected \[4, L, 8\] \(the 3 declared classes and the null"),
    ({"joint_attention_dim": 5}, r"has caption \[4, 3, 5\], expected \[4, L, 8\]"),
    ({"pooled_projection_dim": 7}, r"has pooled \[4, 7\], expected \[4, 6\]"),
])
def test_label_tables_of_another_shape_are_one_line_naming_the_key(public_split, tmp_path, user_model, kwargs, match):
    save_label_tables(tmp_path / "bad.safetensors", **{"n_classes": N_CLASSES, **kwargs})
    with pytest.raises(PipelineError, match="^config error at straightdp.pretrain.label_embeddings: .*" + match):
        run(tmp_path, public_split, {**user_model["pretrain"], "label_embeddings": str(tmp_path / "bad.safetensors")})


def test_missing_or_foreign_files_are_one_line(public_split, tmp_path, user_model):
    pretrain = user_model["pretrain"]
    save_unet(tmp_path / "unet", num_class_embeds=None)
    with pytest.raises(PipelineError, match="holds a UNet2DModel, expected a diffusers SD3Transformer2DModel"):
        run(tmp_path, public_split, {**pretrain, "path": str(tmp_path / "unet")})
    with pytest.raises(PipelineError, match="is not a folder: expected a local diffusers SD3Transformer2DModel folder"):
        run(tmp_path, public_split, {**pretrain, "path": str(tmp_path / "nowhere")})
    with pytest.raises(PipelineError, match="^config error at straightdp.pretrain.label_embeddings: .*needs the label"):
        run(tmp_path, public_split, {**pretrain, "label_embeddings": None})
    (tmp_path / "junk.safetensors").write_text("not a tensor file")
    with pytest.raises(PipelineError, match="is not a safetensors file"):
        run(tmp_path, public_split, {**pretrain, "label_embeddings": str(tmp_path / "junk.safetensors")})
    from safetensors.torch import save_file

    save_file({"caption": torch.zeros(4, 3, 8)}, str(tmp_path / "half.safetensors"))
    with pytest.raises(PipelineError, match="has no tensor 'pooled'"):
        run(tmp_path, public_split, {**pretrain, "label_embeddings": str(tmp_path / "half.safetensors")})
    for f in (tmp_path / "sd3").glob("*.safetensors"):
        os.remove(f)
    with pytest.raises(PipelineError, match="diffusers cannot load"):
        run(tmp_path, public_split, pretrain)


def test_files_changed_after_planning_are_refused(public_split, tmp_path, user_model):
    planned = public_model(user_model["pretrain"])
    save_label_tables(tmp_path / "labels.safetensors", n_classes=N_CLASSES, seed=1)
    with pytest.raises(PipelineError, match="changed since the DAG was planned .label_embeddings_sha256"):
        run(tmp_path, public_split, user_model["pretrain"], planned=planned)


def test_pretrain_straightdp_refuses_an_import_config(public_split, tmp_path, user_model):
    with pytest.raises(PipelineError, match="rule import_straightdp loads the public flow instead"):
        sdp.pretrain_straightdp({"public": public_split}, {"model": tmp_path / "m.pt"},
                                {"straightdp": {"pretrain": user_model["pretrain"]}})


# --------------------------------------------------------------------------- before any job, and the config ids

def _config(tmp_path, **pretrain):
    cfg = yaml.safe_load(open(os.path.join(ROOT, "config.yaml")))
    return validate_config(deep_merge(cfg, {"results_dir": str(tmp_path / "r"),
                                            "straightdp": {"pretrain": {"source": "diffusers", **pretrain}}}))


def test_the_config_checks_both_files_before_any_job_is_scheduled(tmp_path):
    with pytest.raises(ConfigError, match="^config error at straightdp.pretrain.path: straightdp.pretrain.source "
                                          "diffusers needs the path"):
        check_inputs_exist(_config(tmp_path))
    save_sd3(tmp_path / "m", sample_size=16)  # config.yaml: 16x16 grey digits, 10 classes
    with pytest.raises(ConfigError, match="^config error at straightdp.pretrain.label_embeddings: .*needs the label"):
        check_inputs_exist(_config(tmp_path, path=str(tmp_path / "m")))
    save_label_tables(tmp_path / "l.safetensors", n_classes=10)
    check_inputs_exist(_config(tmp_path, path=str(tmp_path / "m"), label_embeddings=str(tmp_path / "l.safetensors")))
    save_sd3(tmp_path / "rgb", sample_size=16, channels=3)
    with pytest.raises(ConfigError, match="maps 3 to 3 channels, the flow's data have 1"):
        check_inputs_exist(_config(tmp_path, path=str(tmp_path / "rgb"), label_embeddings=str(tmp_path / "l.safetensors")))
