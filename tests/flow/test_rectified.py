"""The straight path, its loss and the guided Euler sampler (STRAIGHTDP eq. 1, 2; Table 9)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.flow.rectified import (euler_sample, euler_times, flow_loss, guided_velocity, interpolate, sample_t,
                                     velocity_target, x_t_from)
from pipeline.privacy.dpsgd import multiplicity_loss


def test_t_zero_is_the_noise_end_and_the_path_is_straight():
    g = torch.Generator().manual_seed(0)
    z, xi = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    assert torch.equal(interpolate(z, xi, 0.0), xi)
    assert torch.equal(interpolate(z, xi, 1.0), z)
    t = torch.tensor([0.0, 0.25, 0.5, 1.0])
    x = interpolate(z, xi, t)
    assert torch.allclose(x[1], 0.75 * xi[1] + 0.25 * z[1])
    # d x_t / dt is the target z - xi at every t (finite difference of a straight line is exact)
    dt = 1e-3
    assert torch.allclose((interpolate(z, xi, t + dt) - x) / dt, velocity_target(z, xi), atol=1e-3)
    assert torch.equal(x_t_from(z, xi, 0.3), interpolate(z, xi, 0.3))
    with pytest.raises(ValueError, match=r"one time per example"):
        interpolate(z, xi, torch.rand(3))


def test_flow_loss_is_the_per_example_mean_squared_error_of_eq1():
    g = torch.Generator().manual_seed(1)
    z, xi = torch.randn(5, 2, 3, 3, generator=g), torch.randn(5, 2, 3, 3, generator=g)
    t, y = torch.rand(5, generator=g), torch.arange(5)
    seen = {}

    def model_fn(x, tt, yy):
        seen.update(x=x, t=tt, y=yy)
        return torch.zeros_like(x)

    loss = flow_loss(model_fn, z, t, xi, y)
    assert loss.shape == (5,)
    assert torch.allclose(loss, (z - xi).pow(2).flatten(1).mean(1))
    assert torch.allclose(seen["x"], interpolate(z, xi, t)) and seen["t"] is t and seen["y"] is y
    # the exact velocity has zero loss; the unconditional call passes no label
    assert torch.allclose(flow_loss(lambda x, tt: velocity_target(z, xi), z, t, xi), torch.zeros(5))


def test_flow_loss_plugs_into_noise_multiplicity_with_sigma_as_t():
    g = torch.Generator().manual_seed(2)
    z, y = torch.randn(3, 4, generator=g), torch.tensor([1, 2, 0])
    t, xi = torch.rand(3, 4, generator=g), torch.randn(3, 4, 4, generator=g)  # K = 4 draws per example
    w = torch.randn(4, 4, generator=g)
    model_fn = lambda x, tt, yy: x @ w + tt[:, None] + yy[:, None]  # noqa: E731
    per_example = multiplicity_loss(flow_loss)
    for i in range(3):
        want = flow_loss(model_fn, z[i].expand(4, 4), t[i], xi[i], y[i].expand(4)).mean()
        assert torch.allclose(per_example(model_fn, z[i], t[i], xi[i], y[i]), want)


@settings(max_examples=30, deadline=None)
@given(lo=st.floats(0.0, 0.9), width=st.floats(1e-6, 1.0), seed=st.integers(0, 2 ** 16))
def test_sample_t_stays_in_its_half_open_interval(lo, width, seed):
    hi = min(1.0, lo + width)
    t = sample_t(200, torch.Generator().manual_seed(seed), lo, hi)
    assert t.dtype == torch.float32 and bool((t >= lo).all()) and bool((t < hi).all())


def test_sample_t_is_uniform_and_refuses_bad_ranges():
    t = sample_t(20000, torch.Generator().manual_seed(3), 0.2, 0.6, dtype=torch.float64)
    assert abs(float(t.mean()) - 0.4) < 0.005 and abs(float(t.var()) - 0.4 ** 2 / 12) < 0.001
    with pytest.raises(ValueError, match="0 <= lo < hi <= 1"):
        sample_t(3, None, 0.5, 0.5)


def test_guidance_mixes_the_branches_in_one_batched_call():
    calls = []

    def v(x, t, y):
        calls.append(len(x))
        return x * 0 + y[:, None].to(x.dtype)  # branch value = its label

    x, t, y = torch.zeros(3, 2), torch.zeros(3), torch.tensor([1, 2, 3])
    assert torch.equal(guided_velocity(v, x, t, y, guidance=1.0, null_label=9), y[:, None].float().expand(3, 2))
    assert torch.equal(guided_velocity(v, x, t, y, guidance=0.0, null_label=9), torch.full((3, 2), 9.0))
    calls.clear()
    mixed = guided_velocity(v, x, t, y, guidance=1.5, null_label=9)
    assert calls == [6]  # both branches in one batch of 2B
    assert torch.allclose(mixed, (9 + 1.5 * (y - 9))[:, None].float().expand(3, 2))
    with pytest.raises(ValueError, match="needs the null label"):
        guided_velocity(v, x, t, y, guidance=1.5, null_label=None)


def test_euler_sample_integrates_a_known_field_exactly_and_starts_at_t0():
    # v = z* - x0 is constant along the straight path from x0 to z*: Euler is exact for any step count
    target = torch.tensor([[2.0, -1.0]])
    start = torch.tensor([[0.5, 0.5]])
    v = lambda x, t: (target - start).expand_as(x)  # noqa: E731
    assert torch.allclose(euler_sample(v, x0=start, steps=7, y=None), target)
    # a field that depends on t: dx/dt = t -> x(1) = x(t0) + (1 - t0^2)/2; Euler's error is (1 - t0)^2/(2N)
    lin = lambda x, t: t[:, None].expand_as(x)  # noqa: E731
    out = euler_sample(lin, x0=torch.zeros(1, 1), t0=0.4, steps=25, y=None)
    assert abs(float(out) - (0.5 * (1 - 0.16) - 0.36 / 50)) < 1e-6
    assert torch.allclose(euler_times(0.4, 3), torch.tensor([0.4, 0.6, 0.8, 1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="t0 must be in"):
        euler_sample(lin, x0=torch.zeros(1, 1), t0=1.0, y=None)


def test_euler_sample_builds_no_graph_and_keeps_the_state_dtype():
    w = torch.nn.Parameter(torch.ones(()))
    out = euler_sample(lambda x, t, y: (w * x).float(), x0=torch.ones(2, 3, dtype=torch.float64), y=torch.zeros(2).long(),
                       guidance=1.0, steps=4)
    assert not out.requires_grad and out.dtype == torch.float64
    assert torch.allclose(out, torch.full((2, 3), 1.25 ** 4, dtype=torch.float64))
