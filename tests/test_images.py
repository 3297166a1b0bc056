"""One uint8 <-> [-1, 1] conversion reproduces, bit for bit, every expression it replaced."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.images import to_pixel_scale, to_uint8, to_unit_scale

ALL_PIXELS = np.arange(256, dtype=np.uint8).reshape(1, 1, 16, 16)


def floats(dtype: torch.dtype) -> torch.Tensor:
    """Random states well outside [-1, 1], the grid's exact points and ties, the endpoints, +-inf."""
    g = torch.Generator().manual_seed(0)
    random = torch.randn(4096, generator=g, dtype=torch.float64) * 1.5
    grid = torch.arange(-2, 513, dtype=torch.float64) / 255 * 2 - 1  # pixels and half-pixels
    ties = (torch.arange(0, 256, dtype=torch.float64) + 0.5) / 127.5 - 1
    special = torch.tensor([-1.0, 1.0, 0.0, -0.0, float("inf"), -float("inf"), 1 + 1e-7, -1 - 1e-7],
                           dtype=torch.float64)
    return torch.cat([random, grid, ties, special]).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_to_unit_scale_is_the_old_expressions_for_every_pixel_value(dtype):
    t = torch.from_numpy(ALL_PIXELS)
    new = to_unit_scale(ALL_PIXELS, dtype)
    assert new.dtype == dtype
    assert torch.equal(new, t.to(dtype) / 127.5 - 1.0)  # training.data, diagnostics.empden_proxy
    assert torch.equal(new, t.to(dtype).div_(127.5).sub_(1.0))  # sampling.empden_stage (in place)
    if dtype == torch.float32:
        assert torch.equal(to_unit_scale(t, dtype), t.float() / 127.5 - 1.0)  # evaluation.evalnet
    assert new.min().item() == -1.0 and new.max().item() == 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_to_uint8_is_the_old_expressions_for_random_and_out_of_range_floats(dtype):
    x = floats(dtype)
    new = to_uint8(x, dtype)
    # sampling.dpdm (float32): round, then clamp to 0..255
    old_dpdm = ((x.to(dtype) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
    # sampling.empden_stage (float64): clamp to [-1, 1], then round
    old_empden = ((x.detach().to(dtype).clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu().numpy()
    np.testing.assert_array_equal(new, old_dpdm)
    np.testing.assert_array_equal(new, old_empden)
    assert new.dtype == np.uint8


def test_to_pixel_scale_is_the_proxy_expression():
    x = floats(torch.float64)
    old = ((x.float().clamp(-1.0, 1.0) + 1.0) * 127.5).round()  # diagnostics.empden_proxy.to_pixels
    assert torch.equal(to_pixel_scale(x, torch.float32), old)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_pixel_survives_the_round_trip(dtype):
    np.testing.assert_array_equal(to_uint8(to_unit_scale(ALL_PIXELS, dtype), dtype), ALL_PIXELS)


def test_the_callers_keep_their_dtypes():
    from pipeline.methods.empden import sample_stage as empden_stage
    from pipeline.sampling import samplers
    from pipeline.training.data import to_model_scale

    assert to_model_scale(ALL_PIXELS).dtype == torch.float32
    assert empden_stage.to_model_scale(ALL_PIXELS).dtype == torch.float64
    x = torch.tensor([-1.5, -1.0, 0.0, 1.0, 2.0])
    assert samplers.to_uint8(x).tolist() == empden_stage.to_uint8(x).tolist() == [0, 0, 128, 255, 255]
