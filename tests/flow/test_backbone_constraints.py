"""STRAIGHTDP Sec. 3.3's three backbone constraints, each an exact property that fails when its switch is broken.

* stream-norm clamp: every token of both streams entering a block lies in the B0-ball, and a token inside it
  is untouched;
* late injection: the image stream before the last l0 blocks does not depend on the condition at all;
* decoupled attention: a block's image update is exactly F(h) + G(h, e) with F caption-independent;
* post-hoc imposition is a separate, labelled path; constraints survive the model file.
"""

from dataclasses import replace

import pytest
import torch

from pipeline.flow.backbone import (FlowSpec, MatmulJointAttnProcessor, _attend, build_flow_model, clamp_tokens,
                                    impose_post_hoc)
from pipeline.flow.rectified import flow_loss
from pipeline.privacy.dpsgd import per_example_gradients
from tests.conftest import one_thread
from tests.flow.test_backbone import TINY, tiny_model

SPEC3 = replace(TINY, num_layers=3)


def _inputs(b: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 1, 8, 8, generator=g), torch.rand(b, generator=g)


def _block_inputs(model) -> list[dict]:
    """Record the (image, caption) streams every block receives (forward pre-hooks with kwargs)."""
    seen: list[dict] = []
    for block in model.net.transformer.transformer_blocks:
        block.register_forward_pre_hook(lambda m, args, kwargs: seen.append(dict(kwargs)), with_kwargs=True)
    return seen


def test_clamp_tokens_is_the_projection_onto_the_ball():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(50, 7, generator=g) * torch.logspace(-2, 2, 50)[:, None]
    out = clamp_tokens(h, 1.5)
    norms, before = out.norm(dim=-1), h.norm(dim=-1)
    assert torch.all(norms <= 1.5 * (1 + 1e-6))
    inside = before <= 1.5
    assert torch.equal(out[inside], h[inside])  # bit for bit
    assert torch.allclose(norms[~inside], torch.full_like(norms[~inside], 1.5))
    assert torch.allclose(out[~inside] / norms[~inside, None], h[~inside] / before[~inside, None])  # same direction
    assert torch.equal(clamp_tokens(torch.zeros(2, 3), 1.0), torch.zeros(2, 3))
    # 1-Lipschitz (Lemma B.2)
    u, v = torch.randn(200, 7, generator=g) * 3, torch.randn(200, 7, generator=g) * 3
    assert torch.all((clamp_tokens(u, 1.0) - clamp_tokens(v, 1.0)).norm(dim=-1) <= (u - v).norm(dim=-1) + 1e-6)


def test_all_switches_off_the_block_by_block_forward_is_sd3s():
    with one_thread():
        model = tiny_model(1, SPEC3).eval()
        x, t = _inputs()
        y = torch.tensor([0, 1, 2, 3])
        net = model.net
        caption = net.caption(y).view(4, SPEC3.caption_tokens, SPEC3.joint_attention_dim)
        ts = 1000 * (1 - t)
        with torch.no_grad():
            ours = net.constrained_forward(x, ts, caption, net.pooled(y))
            sd3 = net.transformer(x, encoder_hidden_states=caption, pooled_projections=net.pooled(y), timestep=ts,
                                  return_dict=False)[0]
        assert torch.allclose(ours, sd3, atol=1e-6, rtol=1e-5)


def test_stream_clamp_bounds_every_token_entering_every_block():
    B0 = 0.8
    with one_thread(), torch.no_grad():
        x, t = _inputs()
        y = torch.tensor([0, 1, 2, 3])
        free = tiny_model(1, SPEC3).eval()
        seen_free = _block_inputs(free)
        free(x * 20, t, y)
        # the test has teeth: without the clamp, tokens do exceed B0
        assert max(float(kw["hidden_states"].norm(dim=-1).max()) for kw in seen_free) > 2 * B0
        clamped = impose_post_hoc(free, stream_clamp=B0)
        seen = _block_inputs(clamped)
        clamped(x * 20, t, y)
        assert len(seen) == SPEC3.num_layers
        for kw in seen:
            for stream in ("hidden_states", "encoder_hidden_states"):
                assert float(kw[stream].norm(dim=-1).max()) <= B0 * (1 + 1e-5), stream
        # a B0 no token reaches changes nothing: the clamp is the identity inside the ball
        loose = impose_post_hoc(free, stream_clamp=1e6)
        assert torch.allclose(loose(x, t, y), free(x, t, y), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("decoupled", [False, True])
def test_late_injection_the_image_stream_before_the_last_l0_blocks_ignores_the_condition(decoupled):
    l0 = 1
    spec = replace(SPEC3, late_injection=l0, decoupled_attention=decoupled)
    with one_thread(), torch.no_grad():
        x, t = _inputs()
        model = tiny_model(2, spec).eval()
        net = model.net
        ts = 1000 * (1 - t)
        taps = {}
        for y in (torch.tensor([0, 1, 2, 3]), torch.tensor([3, 2, 1, 0])):
            caption = net.caption(y).view(4, spec.caption_tokens, spec.joint_attention_dim)
            taps[int(y[0])] = []
            out = net.constrained_forward(x, ts, caption, net.pooled(y), taps=taps[int(y[0])])
            taps[int(y[0])].append((out, None))
        a, b = taps[0], taps[3]
        for i in range(spec.num_layers - l0):
            assert torch.equal(a[i][0], b[i][0]), f"block {i}: the image stream saw the condition"
        assert not torch.allclose(a[-1][0], b[-1][0]), "the last block must inject the condition"
        # teeth: the same weights without late injection let the label in at block 0
        free = impose_post_hoc(tiny_model(2, SPEC3), decoupled_attention=True) if decoupled else tiny_model(2, SPEC3)
        got = []
        for y in (torch.tensor([0, 1, 2, 3]), torch.tensor([3, 2, 1, 0])):
            caption = free.net.caption(y).view(4, spec.caption_tokens, spec.joint_attention_dim)
            taps_free: list = []
            free.net.constrained_forward(x, ts, caption, free.net.pooled(y), taps=taps_free)
            got.append(taps_free[0][0])
        assert not torch.allclose(got[0], got[1])


def _streams(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 16, 16, generator=g), torch.randn(2, 2, 16, generator=g), torch.randn(2, 2, 16, generator=g)


def _cross_term(attn, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """G(h, e) written from the paper: W_out softmax(Q_h K_e^T / sqrt d) V_e (no bias: the bias is F's)."""
    b = h.shape[0]

    def heads(u):
        return u.view(b, -1, attn.heads, u.shape[-1] // attn.heads).transpose(1, 2)

    q = heads(attn.to_q(h))
    ck, cv = heads(attn.add_k_proj(e)), heads(attn.add_v_proj(e))
    if attn.norm_q is not None:
        q = attn.norm_q(q)
    if attn.norm_added_k is not None:
        ck = attn.norm_added_k(ck)
    return _attend(q, ck, cv) @ attn.to_out[0].weight.T


def test_decoupled_attention_splits_the_image_update_exactly_into_F_of_h_plus_G_of_h_and_e():
    with one_thread(), torch.no_grad():
        model = tiny_model(3, replace(TINY, decoupled_attention=True)).eval()
        attn = model.net.transformer.transformer_blocks[0].attn
        h, e1, e2 = _streams()
        decoupled = MatmulJointAttnProcessor(decoupled=True)
        self_only = MatmulJointAttnProcessor(cross=False)
        F = self_only(attn, h, e1)[0]
        assert torch.equal(F, self_only(attn, h, e2)[0])  # F is caption-independent
        for e in (e1, e2):
            out = decoupled(attn, h, e)[0]
            assert torch.allclose(out, F + _cross_term(attn, h, e), atol=1e-6, rtol=1e-5)
        # teeth: SD3's joint softmax does not split this way
        joint = MatmulJointAttnProcessor()(attn, h, e1)[0]
        assert not torch.allclose(joint, F + _cross_term(attn, h, e1), atol=1e-3)
        # the model uses the decoupled processor in every block
        assert all(b.attn.processor.decoupled for b in model.net.transformer.transformer_blocks)


def test_per_example_gradients_of_a_constrained_backbone_match_single_example_backward_passes():
    spec = replace(SPEC3, stream_clamp=0.5, late_injection=1, decoupled_attention=True)
    with one_thread():
        model = tiny_model(4, spec).train()
        g = torch.Generator().manual_seed(5)
        z, xi = torch.randn(3, 1, 8, 8, generator=g), torch.randn(3, 1, 8, 8, generator=g)
        t, y = torch.rand(3, generator=g), torch.tensor([0, 3, 2])

        def one(model_fn, zi, ti, xii, yi):
            return flow_loss(model_fn, zi[None], ti[None], xii[None], yi[None])[0]

        grads, _ = per_example_gradients(model, one, (z, t, xi, y))
        for i in range(3):
            model.zero_grad(set_to_none=True)
            flow_loss(model, z[i:i + 1], t[i:i + 1], xi[i:i + 1], y[i:i + 1])[0].backward()
            for name, p in model.named_parameters():
                if p.grad is not None:
                    assert torch.allclose(grads[name][i], p.grad, atol=1e-6, rtol=1e-4), name


def test_post_hoc_is_a_separate_labelled_path_and_constraints_survive_the_spec_json():
    free = tiny_model(5, TINY)
    post = impose_post_hoc(free, stream_clamp=0.1)
    assert post.net.spec.post_hoc and post.net.spec.stream_clamp == 0.1
    assert all(torch.equal(a, b) for a, b in zip(free.state_dict().values(), post.state_dict().values()))
    x, t = _inputs()
    with torch.no_grad():
        assert not torch.allclose(post(x, t), free(x, t))
    with pytest.raises(ValueError, match="already has constraints"):
        impose_post_hoc(post, late_injection=1)
    # trained inside the constraints from the start: built constrained, not post hoc
    inside = build_flow_model(replace(TINY, stream_clamp=0.1))
    assert inside.net.spec.constrained and not inside.net.spec.post_hoc
    spec = replace(SPEC3, stream_clamp=16.0, late_injection=1, decoupled_attention=True)
    assert FlowSpec.from_json(spec.to_json()) == spec
    old = {k: v for k, v in TINY.to_json().items()
           if k not in ("stream_clamp", "late_injection", "decoupled_attention", "post_hoc")}
    assert FlowSpec.from_json(old) == TINY  # a file written before the switches existed
    for bad, match in [({"stream_clamp": 0}, "stream_clamp"), ({"late_injection": 4}, r"late_injection .*num_layers = 3\], got 4"),
                       ({"decoupled_attention": 1}, "decoupled_attention"), ({"post_hoc": True}, "post_hoc")]:
        with pytest.raises(ValueError, match=match):
            replace(SPEC3, **bad)


def test_the_config_switches_reach_the_pretrained_flows_spec_and_typos_are_one_line_errors():
    import numpy as np

    from pipeline.config import ConfigError, validate_config
    from pipeline.flow.backbone import flow_spec
    from pipeline.io import Split

    cfg = validate_config({"straightdp": {"flow": {"stream_clamp": 16, "late_injection": 1,
                                                   "decoupled_attention": True}}})["straightdp"]
    split = Split(np.zeros((4, 1, 16, 16), dtype=np.uint8), np.arange(4))
    spec = flow_spec(cfg, split, 10)
    assert (spec.stream_clamp, spec.late_injection, spec.decoupled_attention, spec.post_hoc) == (16.0, 1, True, False)
    default = flow_spec(validate_config({})["straightdp"], split, 10)
    assert not default.constrained  # the embedded default's flow is SD3's MM-DiT as is
    with pytest.raises(ConfigError, match="stream_clamp"):
        validate_config({"straightdp": {"flow": {"stream_clamp": 0}}})
    with pytest.raises(Exception, match="late_injection .* num_layers = 2"):
        flow_spec(validate_config({"straightdp": {"flow": {"late_injection": 3}}})["straightdp"], split, 10)
