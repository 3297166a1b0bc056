"""Stages dp_hp, dp_ntk and dp_mepf: one release each, its ledger line within the target and bound to the run,
DP-MERF's generator fitted to it, balanced samples; DP-MEPF needs its public CLIP."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.baselines.dp_merf import load_generator
from pipeline.baselines.embedding_family import dp_hp, dp_mepf, dp_ntk
from pipeline.io import load_split
from pipeline.privacy import ledger
from pipeline.privacy.replay import audit
from pipeline.stage import PipelineError
from tests.baselines.test_dp_merf import write_splits
from tests.baselines.test_features import random_clip
from tests.conftest import one_thread

SMALL = {"delta": 1e-5, "n_samples": 12, "dp_merf": {"steps": 4, "batch_size": 12, "hidden": 8, "z_dim": 4, "lr": 1e-3},
         "dp_hp": {"order": 4, "prod_order": 2, "n_pairs": 5, "alpha": 0.5}, "dp_ntk": {"width": 6},
         "dp_mepf": {"beta": 0.5}}
STAGES = {"dp_hp": dp_hp, "dp_ntk": dp_ntk, "dp_mepf": dp_mepf}


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    """DP-MERF's test splits (30 private, 20 public 8 x 8 images of 3 classes) and a public CLIP beside them."""
    d = write_splits(tmp_path_factory.mktemp("data"))
    random_clip(d / "clip.pt")
    return d


def run(splits, tmp, method, eps="2", **extra_inputs):
    out = {"samples": tmp / "s.npz", "ledger": tmp / "l.jsonl", "metrics": tmp / "m.json",
           "generator": tmp / "g.safetensors"}
    inputs = {"data": splits / "private.npz", "public": splits / "public.npz", **extra_inputs}
    with one_thread():
        STAGES[method](inputs, out, {"run": f"{method}_eps{eps}_seed0", "baselines": SMALL, "device": "cpu",
                                     "config_id": "t", "private": {"N": 30, "n_classes": 3},
                                     "ledger_binding": {"run": "r", "experiment": "exp"}})
    return out


@pytest.mark.parametrize("method", ["dp_hp", "dp_ntk", "dp_mepf"])
def test_a_run_writes_balanced_samples_one_certified_line_and_its_generator(splits, tmp_path, method):
    out = run(splits, tmp_path, method, **({"clip": splits / "clip.pt"} if method == "dp_mepf" else {}))
    samples = load_split(out["samples"])
    assert samples.images.shape == (12, 1, 8, 8) and np.bincount(samples.labels).tolist() == [4, 4, 4]
    entry = ledger.only_line(out["ledger"], f"{method}_embedding")
    assert entry.claimed_epsilon <= 2.0 and entry.extra["m"] == 30 and entry.sensitivity == pytest.approx(2 / 30)
    assert entry.stage == method and entry.run == "r" and entry.adjacency == "replace_one"
    results, _ = audit({"l": out["ledger"]}, {"l": 1})
    assert results[0]["ok"] and results[0]["recomputed_epsilon"] <= 2.0
    metrics = json.loads(out["metrics"].read_text())
    assert metrics["noise_multiplier"] == pytest.approx(entry.noise_multiplier)
    assert metrics["feature_dim"] == entry.extra["feature_dim"] and np.isfinite(metrics["loss_last"])
    G, meta = load_generator(out["generator"])
    assert meta["stage"] == method and meta["epsilon"] == entry.claimed_epsilon


def test_dp_mepf_without_its_public_clip_is_a_one_line_error(splits, tmp_path):
    with pytest.raises(PipelineError, match="clip"):
        run(splits, tmp_path, "dp_mepf")


def test_another_methods_run_name_is_refused(splits, tmp_path):
    with pytest.raises(PipelineError, match="is a dp_hp run, this stage runs dp_ntk"):
        out = {"samples": tmp_path / "s.npz", "ledger": tmp_path / "l.jsonl", "metrics": tmp_path / "m.json"}
        dp_ntk({"data": splits / "private.npz", "public": splits / "public.npz"}, out,
               {"run": "dp_hp_eps1_seed0", "baselines": SMALL, "private": {"N": 30, "n_classes": 3}})
