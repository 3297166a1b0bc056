"""train_dpsgd_classifier: DPDM's task-specific DP-SGD classifier writes a bound ledger line the replay certifies within
its target, an accuracy in [0, 1], and its noise is the calibrated sigma C (a run without noise is refused)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.io import Split, save_split
from pipeline.privacy import dpsgd, ledger, rebuild
from pipeline.privacy.rebuild import RebuildError
from pipeline.stage import PipelineError
from pipeline.methods.dpdm.dpsgd_classifier import (ClassifierConfig, build_classifier, dpsgd_engine,
                                                train_dpsgd_classifier)
from tests.conftest import one_thread
from tests.ledgers import registration, replay_stage

N, CLASSES = 40, 3
BASE = {"epsilon": 1.0, "delta": 1e-5, "batch_size": 10, "epochs": 1, "lr": 0.01, "micro_batch": 8, "width": 4,
        "feature_dim": 8, "seed": 0, "device": "cpu", "threads": 1, "config_id": "test",
        "ledger_binding": {"run": "cnn_eps1_seed0", "experiment": "exp"}, "private": {"N": N, "n_classes": CLASSES}}


def split(path: Path, n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % CLASSES
    # a class-dependent brightness, so a classifier has something to learn
    images = (rng.integers(0, 60, (n, 1, 8, 8)) + 80 * labels[:, None, None, None]).astype(np.uint8)
    save_split(path, Split(images, labels), name=path.stem, source="test", seed=seed)
    return path


@pytest.fixture(scope="module")
def splits(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("data")
    return {"data": split(tmp / "private_train.npz", N, 0), "test": split(tmp / "test.npz", 30, 1),
            "val": split(tmp / "val.npz", 30, 2)}


def outputs(tmp: Path, run: str = "cnn_eps1_seed0") -> dict[str, Path]:
    return {"model": tmp / "models" / f"{run}.pt", "ledger": tmp / "ledger" / f"train_dpsgd_classifier_{run}.jsonl",
            "metrics": tmp / "eval" / run / "metrics.json"}


@pytest.fixture(scope="module")
def cnn_run(splits, tmp_path_factory) -> dict[str, Path]:
    out = outputs(tmp_path_factory.mktemp("cnn"))
    with one_thread():
        train_dpsgd_classifier(splits, out, {**BASE, "classifier": "cnn"})
    return out


def test_the_ledger_line_is_bound_to_the_run_and_replays_within_the_target(cnn_run, splits, tmp_path):
    (_, entry), = ledger.read_ledger(cnn_run["ledger"])
    assert entry.mechanism == "dpsgd" and entry.stage == "train_dpsgd_classifier" and entry.run == "cnn_eps1_seed0"
    assert entry.sampling["probability"] == pytest.approx(10 / N)  # q = batch_size / declared N
    assert entry.count == 4 and entry.claimed_epsilon <= BASE["epsilon"]
    # the replay as rule replay runs it: registered as the wiring registers it (run, stage, delta, private split)
    report = replay_stage(tmp_path, data=splits["data"], expected={"t": registration(
        cnn_run["ledger"], splits["data"], run="cnn_eps1_seed0", stage="train_dpsgd_classifier", delta=1e-5)},
        t=cnn_run["ledger"])
    assert report["all_ok"], report
    (claim,) = report["claims"]
    assert claim["recomputed_epsilon"] <= BASE["epsilon"]


def test_the_metrics_hold_a_test_and_val_accuracy_and_the_certified_eps(cnn_run):
    m = json.loads(cnn_run["metrics"].read_text())
    assert 0 <= m["acc_cnn"] <= 1 and 0 <= m["acc_cnn_val"] <= 1 and m["n_test"] == 30 and m["n_val"] == 30
    assert m["epsilon"] <= m["target_epsilon"] == 1.0 and m["accountant"] == "pld_pessimistic" and m["private"]
    assert m["steps"] == 4 and m["noise_multiplier"] > 0 and m["classifier"] == "cnn"
    blob = torch.load(cnn_run["model"], weights_only=True)
    assert blob["format"] == "dpgen-dpsgd-classifier/1" and blob["arch"]["n_classes"] == CLASSES


def test_logistic_regression_trains_under_the_same_mechanism(splits, cnn_run, tmp_path):
    out = outputs(tmp_path, "logreg_eps1_seed0")
    with one_thread():
        train_dpsgd_classifier(splits, out, {**BASE, "classifier": "logreg",
                                             "ledger_binding": {"run": "logreg_eps1_seed0", "experiment": "exp"}})
    (_, a), = ledger.read_ledger(cnn_run["ledger"])
    (_, b), = ledger.read_ledger(out["ledger"])
    assert (a.noise_multiplier, a.count, a.claimed_epsilon) == (b.noise_multiplier, b.count, b.claimed_epsilon)
    assert 0 <= json.loads(out["metrics"].read_text())["acc_logreg"] <= 1


def test_the_engine_adds_gaussian_noise_of_sigma_times_the_clip_norm(splits):
    """Noise switched off (or scaled wrongly) in the classifier's engine fails here: an empty batch releases pure
    noise, whose std times the expected batch q N must be sigma C."""
    cfg = ClassifierConfig.from_params({**BASE, "classifier": "logreg", "clip": 0.5})
    plan = dpsgd.DPSGDPlan(noise_multiplier=3.0, max_grad_norm=0.5, sampling_rate=0.25, dataset_size=N, steps=1,
                           delta=1e-5)
    model = build_classifier(cfg, (1, 8, 8), CLASSES)
    engine = dpsgd_engine(model, plan, cfg, torch.device("cpu"))
    data = (torch.zeros(N, 1, 8, 8), torch.zeros(N, dtype=torch.int64))
    grads, _ = engine.privatised_gradient(data, torch.zeros(0, dtype=torch.int64))
    released = torch.cat([g.flatten() for g in grads.values()]) * plan.expected_batch_size
    assert released.numel() > 150
    assert released.std().item() == pytest.approx(plan.noise_multiplier * plan.max_grad_norm, rel=0.15)


def test_a_line_claiming_no_noise_or_other_noise_than_sigma_c_is_rejected(cnn_run):
    (_, entry), = ledger.read_ledger(cnn_run["ledger"])
    rebuild.check(entry)  # the line as written rebuilds
    d = json.loads(entry.to_json())
    extra = d["extra"]
    edits = [{"noise_std": 0.0, "noise_multiplier": 0.0},  # noise switched off on the line
             {"noise_std": entry.noise_std / 2, "noise_multiplier": entry.noise_multiplier / 2},  # not sigma C
             {"extra": {**extra, "dpsgd_noise_multiplier": 0.0}}]  # the declared mechanism without noise
    for edit in edits:
        with pytest.raises((ledger.LedgerError, RebuildError, dpsgd.DPSGDError)):
            rebuild.check(ledger.LedgerEntry.from_dict({**d, **edit}))


@pytest.mark.parametrize("bad, message", [({"classifier": "svm"}, "classifier"), ({"epsilon": None}, "epsilon"),
                                          ({"batch_size": 0}, "batch_size"), ({"typo": 1}, "unknown param"),
                                          ({"private": {"N": 41, "n_classes": 3}}, "declared private size")])
def test_bad_params_are_one_line_errors(splits, tmp_path, bad, message):
    with pytest.raises(PipelineError, match=message):
        train_dpsgd_classifier(splits, outputs(tmp_path), {**BASE, "classifier": "cnn", **bad})
