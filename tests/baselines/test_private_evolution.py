"""Stage private_evolution: T votes over a public denoiser's candidates, one ledger line of T releases."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline.baselines.private_evolution import (histogram_threshold, output_order, private_evolution, resample,
                                                 variation_sigmas)
from pipeline.io import Split, load_split, save_split
from pipeline.models.checkpoint import save_denoiser
from pipeline.models.edm import EDMPrecond
from pipeline.models.unet import UNetSpec, build_unet
from pipeline.privacy import ledger
from pipeline.privacy.replay import audit
from pipeline.stage import PipelineError
from tests.conftest import one_thread

SMALL = {"delta": 1e-5, "n_samples": 12,
         "pe": {"iterations": 2, "n_per_class": 4, "sampler_steps": 3, "variation_sigma": [1.0, 0.5], "batch_size": 6}}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("pe")
    rng = np.random.default_rng(0)
    save_split(d / "private.npz", Split(rng.integers(0, 256, (30, 1, 8, 8), dtype=np.uint8), np.arange(30) % 3),
               name="private_train", source="test", seed=0)
    spec = UNetSpec(image_size=8, block_out_channels=(8, 16), attention=(False, False), norm_num_groups=4,
                    num_classes=3)
    torch.manual_seed(0)
    save_denoiser(d / "public.pt", EDMPrecond(build_unet(spec)), unet=spec, precond="edm")
    return d


def run(files, tmp, run="pe_eps1_seed0", **pe):
    out = {"samples": tmp / "s.npz", "ledger": tmp / "l.jsonl", "metrics": tmp / "m.json"}
    with one_thread():
        private_evolution({"data": files / "private.npz", "denoiser": files / "public.pt"}, out,
                          {"run": run, "baselines": {**SMALL, "pe": {**SMALL["pe"], **pe}}, "device": "cpu",
                           "config_id": "t", "private": {"N": 30, "n_classes": 3},
                           "ledger_binding": {"run": "r", "experiment": "exp"}})
    return out


def test_a_run_writes_s_t_and_one_line_of_t_releases_within_its_target(files, tmp_path):
    out = run(files, tmp_path)
    samples = load_split(out["samples"])
    assert samples.images.shape == (12, 1, 8, 8) and np.bincount(samples.labels).tolist() == [4, 4, 4]
    entry = ledger.only_line(out["ledger"], "pe_nn_histogram")
    assert entry.count == 2 and entry.claimed_epsilon <= 1.0
    results, _ = audit({"l": out["ledger"]}, {"l": 1})
    assert results[0]["ok"]
    trace = json.loads(out["metrics"].read_text())["trace"]
    assert [t["iteration"] for t in trace] == [1, 2] and trace[0]["variation_sigma"] == 1.0


def test_the_clip_embedding_needs_the_clip_file(files, tmp_path):
    with pytest.raises(PipelineError, match="--in clip="):
        run(files, tmp_path, embedding="clip")


def test_resampling_follows_the_noisy_counts_and_falls_back_to_uniform():
    labels = np.array([0, 0, 0, 1, 1, 1])
    noisy = np.array([0.0, 5.0, 0.0, 0.0, 0.0, 0.0])
    idx, empty = resample(noisy, labels, 50, np.random.default_rng(0))
    assert (idx[:50] == 1).all() and empty == 1
    assert set(idx[50:].tolist()) == {3, 4, 5}


def test_variation_levels_shrink_geometrically_from_first_to_last():
    s = variation_sigmas(2.0, 0.5, 3)
    assert s == pytest.approx([2.0, 1.0, 0.5])
    assert variation_sigmas(2.0, 0.5, 1) == [2.0]


def test_fewer_outputs_than_candidates_keep_every_class():
    """n_samples below |S_T| (e.g. 100 candidates per class, 500 outputs): every class keeps its share."""
    labels = np.repeat(np.arange(10), 100)
    order = output_order(labels)
    assert sorted(order.tolist()) == list(range(1000))
    assert np.bincount(labels[order[:500]], minlength=10).tolist() == [50] * 10
    assert np.bincount(labels[order[:7]], minlength=10).max() == 1


def test_a_run_with_fewer_samples_than_candidates_is_balanced(files, tmp_path):
    out = run(files, tmp_path, n_per_class=8)  # 24 candidates, 12 samples
    assert np.bincount(load_split(out["samples"]).labels).tolist() == [4, 4, 4]


def test_the_threshold_is_in_noise_stds_with_an_optional_floor_in_votes():
    assert histogram_threshold({"threshold": 1.0}, 2.8) == pytest.approx(2.8)
    assert histogram_threshold({"threshold": 1.0, "threshold_votes": 3}, 1.0) == 3.0
    assert histogram_threshold({"threshold": 1.0, "threshold_votes": 3}, 28.0) == pytest.approx(28.0)
