"""The class-conditional MM-DiT: spec, time mapping, labels, the matmul joint attention, torch.func per-example gradients."""

import warnings

import pytest
import torch
from diffusers.models.attention_processor import JointAttnProcessor2_0

from pipeline.flow.backbone import (SD3_TIMESTEP_SCALE, FlowSpec, MatmulJointAttnProcessor, MLPVelocity,
                                    RectifiedFlowVelocity, build_flow_model)
from pipeline.flow.rectified import flow_loss
from pipeline.privacy.dpsgd import multiplicity_loss, per_example_gradients
from tests.conftest import one_thread

TINY = FlowSpec(image_size=8, channels=1, patch_size=2, num_layers=2, attention_head_dim=8, num_attention_heads=2,
                joint_attention_dim=8, caption_projection_dim=16, pooled_projection_dim=8, pos_embed_max_size=4,
                caption_tokens=2, num_classes=3)


def tiny_model(seed: int = 0, spec: FlowSpec = TINY) -> RectifiedFlowVelocity:
    torch.manual_seed(seed)
    model = build_flow_model(spec)
    # diffusers zero-initialises nothing here that would hide a bug, but make every weight non-trivial anyway
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def test_spec_json_round_trip_and_one_line_errors():
    assert FlowSpec.from_json(TINY.to_json()) == TINY
    assert TINY.width == 16 and TINY.null_label == 3
    with pytest.raises(ValueError, match="unknown key 'widht'"):
        FlowSpec.from_json({"widht": 3})
    with pytest.raises(ValueError, match="caption_projection_dim must equal the width .* = 48, got 32"):
        FlowSpec(caption_projection_dim=32)
    with pytest.raises(ValueError, match="not divisible by patch_size 3"):
        FlowSpec(patch_size=3)
    with pytest.raises(ValueError, match="pos_embed_max_size must be >= image_size / patch_size = 8"):
        FlowSpec(pos_embed_max_size=4)
    with pytest.raises(ValueError, match="num_layers must be an integer >= 1"):
        FlowSpec(num_layers=0)


def test_forward_shapes_time_mapping_and_the_null_label():
    with one_thread():
        model = tiny_model().eval()
        x, t, y = torch.randn(3, 1, 8, 8), torch.tensor([0.0, 0.5, 1.0]), torch.tensor([0, 2, 3])
        with torch.no_grad():
            v = model(x, t, y)
            assert v.shape == x.shape
            # no labels = the null label (the unconditional branch), row 3 of both tables
            assert torch.equal(model(x, t), model(x, t, torch.full((3,), 3)))
            assert not torch.allclose(model(x, t, torch.zeros(3).long()), model(x, t))
            # a scalar t is every row's t
            assert torch.equal(model(x, 0.5, y), model(x, torch.full((3,), 0.5), y))
        seen = {}

        class Spy(torch.nn.Module):
            spec = TINY

            def forward(self, x, timestep, labels):
                seen.update(timestep=timestep, labels=labels)
                return x

        RectifiedFlowVelocity(Spy())(x, t)
        # t = 0 (noise end) is SD3's timestep 1000, t = 1 (data end) its 0
        assert torch.allclose(seen["timestep"], SD3_TIMESTEP_SCALE * torch.tensor([1.0, 0.5, 0.0]))
        assert torch.equal(seen["labels"], torch.full((3,), 3))


def test_matmul_joint_attention_equals_diffusers_sdpa_processor():
    with one_thread():
        model = tiny_model(1).eval()
        x, t, y = torch.randn(4, 1, 8, 8), torch.rand(4), torch.tensor([0, 1, 2, 3])
        processors = model.net.transformer.attn_processors
        assert processors and all(isinstance(p, MatmulJointAttnProcessor) for p in processors.values())
        with torch.no_grad():
            ours = model(x, t, y)
            model.net.transformer.set_attn_processor(JointAttnProcessor2_0())
            sdpa = model(x, t, y)
        assert torch.allclose(ours, sdpa, atol=1e-5)


def test_per_example_gradients_under_torch_func_equal_single_example_backward_passes():
    """DP-SGD's vmap(grad(...)) on the MM-DiT: no per-example fallback loop, the loop's numbers."""
    with one_thread():
        model = tiny_model(2).train()
        g = torch.Generator().manual_seed(3)
        b = 3
        z, xi = torch.randn(b, 1, 8, 8, generator=g), torch.randn(b, 1, 8, 8, generator=g)
        t, y = torch.rand(b, generator=g), torch.tensor([0, 3, 2])

        def one(model_fn, zi, ti, xii, yi):
            return flow_loss(model_fn, zi[None], ti[None], xii[None], yi[None])[0]

        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*performance drop.*")  # the SDPA fallback's warning
            grads, losses = per_example_gradients(model, one, (z, t, xi, y))
        for i in range(b):
            model.zero_grad(set_to_none=True)
            loss = flow_loss(model, z[i:i + 1], t[i:i + 1], xi[i:i + 1], y[i:i + 1])[0]
            loss.backward()
            assert float(losses[i]) == pytest.approx(float(loss.detach()), rel=1e-5)
            for name, p in model.named_parameters():
                assert torch.allclose(grads[name][i], p.grad, atol=1e-6, rtol=1e-4), name
        # with noise multiplicity (K = 2 draws of (t, xi) per example, Table 9 uses 4)
        t2, xi2 = torch.rand(b, 2, generator=g), torch.randn(b, 2, 1, 8, 8, generator=g)
        grads2, _ = per_example_gradients(model, multiplicity_loss(flow_loss), (z, t2, xi2, y))
        model.zero_grad(set_to_none=True)
        flow_loss(model, z[1].expand(2, 1, 8, 8), t2[1], xi2[1], y[1].expand(2)).mean().backward()
        for name, p in model.named_parameters():
            assert torch.allclose(grads2[name][1], p.grad, atol=1e-6, rtol=1e-4), name


def test_mlp_velocity_for_the_toy():
    torch.manual_seed(0)
    net = MLPVelocity(2, num_classes=3, hidden=16)
    x = torch.randn(5, 2)
    assert net(x, torch.rand(5), torch.tensor([0, 1, 2, 3, 0])).shape == (5, 2)
    assert torch.equal(net(x, 0.3), net(x, 0.3, torch.full((5,), 3)))
    assert net.null_label == 3 and net.convention == "rectified_flow_t"
