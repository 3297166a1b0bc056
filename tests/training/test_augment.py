"""Augmentation multiplicity's views: translations (edge-replicate) and optional left-right flips, each view a
function of its own example, drawn from the engine's generator."""

from __future__ import annotations

import pytest
import torch
from torch.func import vmap

from pipeline.training.augment import RandomShiftFlip


def by_hand(x: torch.Tensor, dy: int, dx: int, flip: int) -> torch.Tensor:
    """One view by explicit indexing: pixel (i, j) is x[clamp(i - dy), clamp(c(j) - dx)]."""
    _, h, w = x.shape
    out = torch.empty_like(x)
    for i in range(h):
        for j in range(w):
            c = w - 1 - j if flip else j
            out[:, i, j] = x[:, min(max(i - dy, 0), h - 1), min(max(c - dx, 0), w - 1)]
    return out


def test_every_view_is_its_example_translated_and_flipped_as_drawn():
    x = torch.randn(3, 2, 5, 6, generator=torch.Generator().manual_seed(0))
    aug = RandomShiftFlip(max_shift=2, flip=True)
    params = aug.draw(3, 4, torch.Generator().manual_seed(1))
    views = aug.apply(x, params)
    assert views.shape == (3, 4, 2, 5, 6)
    assert params[..., :2].abs().max() <= 2 and set(params[..., 2].unique().tolist()) <= {0, 1}
    for b in range(3):
        for k in range(4):
            dy, dx, flip = params[b, k].tolist()
            torch.testing.assert_close(views[b, k], by_hand(x[b], dy, dx, flip))


def test_no_shift_and_no_flip_is_the_identity_and_flips_stay_off_unless_asked():
    x = torch.randn(2, 1, 4, 4)
    aug = RandomShiftFlip(max_shift=0)
    params = aug.draw(2, 3, torch.Generator().manual_seed(0))
    assert not params.any()
    torch.testing.assert_close(aug.apply(x, params), x.unsqueeze(1).expand(2, 3, 1, 4, 4))


def test_the_views_come_from_the_generator_alone():
    aug = RandomShiftFlip(max_shift=3, flip=True)
    a = aug.draw(5, 4, torch.Generator().manual_seed(7))
    b = aug.draw(5, 4, torch.Generator().manual_seed(7))
    c = aug.draw(5, 4, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_views_of_one_example_run_under_vmap_as_in_a_batch():
    # the engine's per-example gradients see one example's views under vmap
    x = torch.randn(4, 1, 5, 5)
    aug = RandomShiftFlip(max_shift=1, flip=True)
    params = aug.draw(4, 3, torch.Generator().manual_seed(2))
    one = vmap(lambda xi, pi: aug.apply(xi[None], pi[None])[0])(x, params)
    torch.testing.assert_close(one, aug.apply(x, params))


@pytest.mark.parametrize("bad", [-1, 1.5])
def test_a_bad_shift_is_refused(bad):
    with pytest.raises(ValueError, match="max_shift"):
        RandomShiftFlip(max_shift=bad)
