"""DP-LoRA on the frozen public flow (STRAIGHTDP Table 3's route): adapters start at the public model,
DP-SGD moves only them, and merging them gives an ordinary flow checkpoint with the same outputs."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from pipeline.methods.straightdp import stages as sdp
from pipeline.flow.backbone import FlowSpec, build_flow_model
from pipeline.flow.lora import ATTENTION_PROJECTIONS, add_lora, lora_layers, merge_lora
from pipeline.io import read_json
from pipeline.models.checkpoint import load_denoiser
from pipeline.privacy import ledger
from pipeline.privacy.certify import recompute
from tests.methods.straightdp.test_stages import train, world  # noqa: F401 (world: a fixture)

SPEC = FlowSpec(image_size=8, channels=1, patch_size=2, num_layers=2, attention_head_dim=8, num_attention_heads=2,
                joint_attention_dim=8, caption_projection_dim=16, pooled_projection_dim=16, caption_tokens=2,
                num_classes=3)


def inputs_of(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 1, 8, 8, generator=g), torch.rand(4, generator=g), torch.tensor([0, 1, 2, 3])


def test_adapters_start_at_the_public_model_and_only_they_train():
    torch.manual_seed(0)
    public = build_flow_model(SPEC)
    adapted = add_lora(copy.deepcopy(public), rank=2, alpha=2.0)
    x, t, y = inputs_of()
    torch.testing.assert_close(adapted(x, t, y), public(x, t, y), atol=1e-6, rtol=0)  # B = 0 at the start
    trainable = [n for n, p in adapted.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    # both streams' attention projections of both blocks carry an adapter (the last block has no to_add_out)
    wrapped = {name.rsplit(".attn.", 1)[1] for name, _ in lora_layers(adapted)}
    assert wrapped == set(ATTENTION_PROJECTIONS)
    assert len(lora_layers(adapted)) == 2 * len(ATTENTION_PROJECTIONS) - 1


def test_merging_gives_the_adapted_outputs_with_the_public_state_dict_keys():
    torch.manual_seed(1)
    public = build_flow_model(SPEC)
    adapted = add_lora(copy.deepcopy(public), rank=2, alpha=4.0)
    with torch.no_grad():
        for p in adapted.parameters():
            if p.requires_grad:
                p.add_(0.2 * torch.randn_like(p))
    x, t, y = inputs_of(1)
    out = adapted(x, t, y)
    assert (out - public(x, t, y)).abs().max() > 1e-3  # the adapters do change the model
    merged = merge_lora(copy.deepcopy(adapted))
    torch.testing.assert_close(merged(x, t, y), out, atol=1e-5, rtol=0)
    assert set(merged.state_dict()) == set(public.state_dict()) and not lora_layers(merged)


def test_bad_lora_settings_are_one_line():
    with pytest.raises(ValueError, match="rank must be an integer >= 1"):
        add_lora(build_flow_model(SPEC), rank=0, alpha=1.0)


@pytest.mark.parametrize("run", ["lora_uniform_eps1_seed0", "lora_moments_eps1_seed0"])
def test_dp_lora_trains_adapters_of_the_frozen_public_flow_within_its_eps(world, tmp_path, run):  # noqa: F811
    _, out = train(world, tmp_path, run)
    entry = ledger.only_line(out["ledger"], "tha_dpsgd")
    assert recompute(entry) <= 1.0 and entry.extra["row"] == run.split("_eps")[0]
    metrics = read_json(out["metrics"])
    assert metrics["lora"]["rank"] >= 1 and metrics["edges"] == [metrics["tau"], 1.0]  # one uniform bucket
    # the saved model is the merged one: the public flow's keys, and every weight outside the attention
    # projections exactly the public one's (frozen), the projections moved by the adapters
    public, _ = sdp.load_flow(world["init"], torch.device("cpu"))
    trained, _ = sdp.load_flow(out["model"], torch.device("cpu"))
    pub, new = public.state_dict(), trained.state_dict()
    assert set(pub) == set(new)
    frozen = [k for k in pub if not any(f".attn.{m}." in k for m in ATTENTION_PROJECTIONS)]
    assert frozen and all(torch.equal(pub[k], new[k]) for k in frozen)
    assert any(not torch.equal(pub[k], new[k]) for k in pub if k not in frozen)
    assert isinstance(load_denoiser(out["model"]), torch.nn.Module) and np.isfinite(metrics["noise_std"])


def test_a_dp_lora_run_does_not_depend_on_torchs_global_rng(world, tmp_path):  # noqa: F811
    # peft initialises the adapters' A matrices from torch's global RNG: the stage seeds it from the run's own
    # stream first, so the same run gives the same flow whatever ran before it in the process
    models = []
    for disturbance in (1, 2):
        torch.manual_seed(disturbance)
        (tmp_path / str(disturbance)).mkdir()
        _, out = train(world, tmp_path / str(disturbance), "lora_uniform_eps1_seed0")
        models.append(sdp.load_flow(out["model"], torch.device("cpu"))[0].state_dict())
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])
