"""Stages privimage_query_net and privimage_select: a classifier of the public pool's semantics (public data only), the
one noisy semantic histogram of the private split (its certified line, bound to the run), and the public images of
the semantics each class chose, labelled by that class."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.baselines.privimage import privimage_query_net, privimage_select, selected_split, semantic_pool
from pipeline.io import Split, load_split, save_split
from pipeline.privacy import ledger
from pipeline.privacy import semantic_histogram as sh
from pipeline.privacy.replay import audit
from pipeline.stage import PipelineError
from tests.conftest import one_thread

NET = {"query_net": {"width": 8, "feature_dim": 16, "epochs": 20, "batch_size": 16, "lr": 1e-2}}


def blobs(rng: np.random.Generator, labels: np.ndarray, offset: int) -> np.ndarray:
    """8 x 8 images whose class is a bright pixel block at a class-specific place (easy to classify)."""
    x = rng.integers(0, 40, (len(labels), 1, 8, 8), dtype=np.uint8)
    for i, y in enumerate(labels):
        r, c = divmod(int(y) + offset, 4)
        x[i, 0, 2 * r:2 * r + 2, 2 * c:2 * c + 2] = 255
    return x


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    """Public: 3 classes (blocks 0-2); other domain: 3 classes (blocks 3-5); private: 60 images of 3 classes drawn
    like the PUBLIC ones, so each private class's best semantic is its public namesake."""
    d, rng = tmp_path_factory.mktemp("data"), np.random.default_rng(0)
    lab = np.arange(60) % 3
    save_split(d / "public.npz", Split(blobs(rng, lab, 0), lab), name="public", source="test", seed=0)
    save_split(d / "other.npz", Split(blobs(rng, lab, 3), lab), name="other", source="test", seed=0)
    save_split(d / "private.npz", Split(blobs(rng, lab, 0), lab), name="private_train", source="test", seed=0)
    with one_thread():
        privimage_query_net({"public": d / "public.npz", "other": d / "other.npz"},
                            {"model": d / "net.pt", "metrics": d / "net.json"},
                            {"baselines": {"privimage": NET}, "seed": 0, "device": "cpu"})
    return d


def select(d, tmp, eps="10", k=1, **inputs):
    out = {"selected": tmp / "sel.npz", "ledger": tmp / "q.jsonl", "metrics": tmp / "q.json"}
    with one_thread():
        privimage_select({"data": d / "private.npz", "public": d / "public.npz", "query_net": d / "net.pt",
                          "other": d / "other.npz", **inputs}, out,
                         {"run": f"privimage_eps{eps}_seed0", "baselines": {"delta": 1e-5, "privimage":
                                                                             {"k": k, "query_share": 0.5}},
                          "device": "cpu", "config_id": "t", "private": {"N": 60, "n_classes": 3},
                          "ledger_binding": {"run": "r", "experiment": "exp"}})
    return out


def test_the_query_net_knows_both_domains_semantics(splits):
    metrics = json.loads((splits / "net.json").read_text())
    assert metrics["semantics"] == ["public:0", "public:1", "public:2", "other:0", "other:1", "other:2"]
    assert metrics["pool_accuracy"] > 0.9 and metrics["n_pool"] == 120


def test_at_a_large_eps_each_class_chooses_its_public_namesake(splits, tmp_path):
    out = select(splits, tmp_path, eps="100")
    metrics = json.loads(out["metrics"].read_text())
    assert metrics["semantics_by_class"] == {"0": ["public:0"], "1": ["public:1"], "2": ["public:2"]}
    chosen, public = load_split(out["selected"]), load_split(splits / "public.npz")
    # the public images of each chosen semantic, labelled by the class that chose it
    assert len(chosen) == 60 and np.array_equal(np.sort(chosen.labels), np.sort(public.labels))
    entry = ledger.only_line(out["ledger"], sh.MECHANISM)
    assert entry.claimed_epsilon <= 50.0 and entry.run == "r" and entry.stage == "privimage_select"
    assert entry.noise_multiplier == pytest.approx(metrics["noise_multiplier"]) and entry.extra["k"] == 1
    results, _ = audit({"q": out["ledger"]}, {"q": 1})
    assert results[0]["ok"]
    # only the noisy histogram is written: no cell is an integer count
    noisy = np.array(metrics["noisy_histogram"])
    assert noisy.shape == (3, 6) and not np.allclose(noisy, np.round(noisy))


def test_k_semantics_per_class_and_a_shared_semantic_serves_each_class_that_chose_it(splits, tmp_path):
    out = select(splits, tmp_path, eps="100", k=2)
    by_class = json.loads(out["metrics"].read_text())["semantics_by_class"]
    # every record votes for its namesake and one more: each class keeps its namesake and a second semantic
    assert all(len(v) == 2 and f"public:{c}" in v for c, v in by_class.items())
    pool, names = semantic_pool(load_split(splits / "public.npz"), load_split(splits / "other.npz"))
    chosen = np.array([[names.index(s) for s in by_class[str(c)]] for c in range(3)])
    expected = selected_split(pool, chosen)
    got = load_split(out["selected"])
    # 20 images per chosen semantic and class: a semantic two classes chose is in both
    assert len(got) == 40 * 3 and np.array_equal(got.labels, expected.labels)
    assert np.array_equal(got.images, expected.images)
    assert entry_sensitivity(out) == pytest.approx(np.sqrt(2))


def entry_sensitivity(out):
    return ledger.only_line(out["ledger"], sh.MECHANISM).sensitivity


def test_a_query_net_of_another_pool_is_one_line(splits, tmp_path):
    with pytest.raises(PipelineError, match="query_net: it scores 6 semantics, the public pool has 3"):
        out = {"selected": tmp_path / "s.npz", "ledger": tmp_path / "q.jsonl", "metrics": tmp_path / "q.json"}
        privimage_select({"data": splits / "private.npz", "public": splits / "public.npz",
                          "query_net": splits / "net.pt"}, out,
                         {"run": "privimage_eps1_seed0", "baselines": {"privimage": {"k": 1}}, "device": "cpu",
                          "private": {"N": 60, "n_classes": 3}, "ledger_binding": {"run": "r", "experiment": "e"}})
