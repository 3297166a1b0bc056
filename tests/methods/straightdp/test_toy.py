"""The 2-D toy of STRAIGHTDP Fig. 6 (pipeline/methods/straightdp/toy.py): its W2, its public set, its points."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from pipeline.data.embedded import gaussian_mixture_2d
from pipeline.methods.straightdp import toy
from pipeline.methods.straightdp.stages import section
from pipeline.privacy.certify import recompute
from pipeline.methods.straightdp.runs import StraightRun

TOY_DATA = {"n_modes": 4, "radius": 1.0, "std": 0.05}


def test_w2_is_the_best_permutation_by_brute_force():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(6, 2)), rng.normal(size=(6, 2))
    best = min(np.mean(np.sum((a - b[list(p)]) ** 2, axis=1)) for p in itertools.permutations(range(6)))
    assert toy.w2_empirical(a, b) == pytest.approx(math.sqrt(best), rel=1e-12)


def test_w2_of_a_set_and_its_shuffled_translate_is_the_shift():
    a = np.random.default_rng(1).normal(size=(50, 2))
    shift = np.array([0.3, -0.4])
    assert toy.w2_empirical(a, (a + shift)[::-1]) == pytest.approx(0.5, rel=1e-9)
    assert toy.w2_empirical(a, a[np.random.default_rng(2).permutation(50)]) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="same shape"):
        toy.w2_empirical(a, a[:10])


def test_the_public_set_sits_half_way_between_the_private_modes():
    private, _ = gaussian_mixture_2d(4000, n_modes=4, radius=1.0, std=0.01, seed=0)
    public, labels = gaussian_mixture_2d(4000, n_modes=4, radius=1.0, std=0.01, seed=0, rotation=toy.PUBLIC_ROTATION)
    assert np.allclose(private, gaussian_mixture_2d(4000, n_modes=4, radius=1.0, std=0.01, seed=0, rotation=0.0)[0])
    angles = np.degrees(np.arctan2(public[:, 1], public[:, 0])) % 360
    centre = np.array([np.median(angles[labels == k]) for k in range(4)])
    assert np.allclose(centre, [45, 135, 225, 315], atol=1.0)  # private modes at 0, 90, 180, 270
    # W2 between the domains is about the chord between neighbouring modes, 2 sin(pi / 8)
    assert toy.w2_empirical(private[:300], public[:300]) == pytest.approx(2 * math.sin(math.pi / 8), rel=0.05)


@pytest.fixture(scope="module")
def tiny():
    cfg = section({"straightdp": {"delta": 1e-5, "dpsgd": {"micro_batch": 64, "proxy_examples": 8, "buckets": 2,
                                                           "betas": [0, 1], "noise_multiplicity": 2},
                                  "horizon": {"n_times": 5, "n_probe": 16}, "sampling": {"steps": 4},
                                  "toy": {"hidden": 16, "pretrain_steps": 30, "batch_size": 64, "distill_steps": 5,
                                          "dpsgd_steps": 4, "dpsgd_batch_size": 40, "n_eval": 40}}})
    points, labels = gaussian_mixture_2d(400, seed=3, **TOY_DATA)
    with torch.random.fork_rng():
        world = toy.toy_world(points, labels, toy_data={**TOY_DATA, "n": 400}, cfg=cfg, seed=0)
        return cfg, world, toy.pretrain_public(world, cfg, 0)


@pytest.mark.parametrize("row, lines", [("released_only", ["moment_release"]), ("uniform", ["tha_dpsgd"]),
                                        ("tha_moments", ["moment_release", "tha_dpsgd"])])
def test_each_line_of_the_figure_writes_its_mechanisms_and_meets_its_budget(tiny, row, lines):
    cfg, world, public_model = tiny
    before = {k: v.clone() for k, v in public_model.state_dict().items()}
    point = toy.run_point(StraightRun(row, 1.0, 0), world, public_model, cfg, config_id="t")
    assert [e.mechanism for e in point.entries] == lines
    assert point.samples.shape == (40, 2) and np.isfinite(point.samples).all()
    assert all(recompute(e) <= e.claimed_epsilon for e in point.entries)
    assert point.eps_certified <= 1.0
    if row == "tha_moments":  # the release and DP-SGD compose: the total is above either part
        assert point.eps_certified > max(e.claimed_epsilon for e in point.entries)
        assert point.entries[1].extra["tau"] == world.tau > 0
    # the public model is copied, never trained in place (every point starts from the same weights)
    assert all(torch.equal(v, before[k]) for k, v in public_model.state_dict().items())
