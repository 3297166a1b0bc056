"""Downstream accuracy: train on synthetic (image, label) pairs, test on real held-out data.

The utility measure of DPDM (Sec. 5 and its appendix on evaluation: logistic regression,
MLP and CNN trained on synthesized samples, evaluated on real data) and of STRAIGHTDP's
"Acc" columns (Tables 1 and 4: train on synthetic, test on real). Three classifiers, each
seeded:

* ``logreg``: scikit-learn ``LogisticRegression`` (multinomial, L-BFGS) on pixels / 255; its fit
  is a deterministic convex solve (the seed is not used by L-BFGS), so it is fitted once and its
  accuracy counted for every repeat (standard deviation 0) instead of refitted ``repeats`` times;
* ``mlp``: scikit-learn ``MLPClassifier`` with one hidden layer of ``mlp_hidden`` units;
* ``cnn``: the evaluation-CNN architecture (:class:`pipeline.evaluation.evalnet.EvalNet`)
  trained from scratch on the synthetic pairs for ``cnn_epochs`` epochs.

A classifier trained on data with a single class predicts that class (scikit-learn
refuses to fit one class; a collapsed generator should score what it deserves, not crash).

Each classifier is trained ``repeats`` times (seeds ``seed .. seed + repeats - 1``) and its
accuracy is the mean, with the sample standard deviation beside it. On a few hundred synthetic
images one CNN training run is a noisy measurement: on the embedded default's DPDM samples the
CNN accuracy spread 0.33..0.48 over five classifier seeds of the same sample set, larger than
the gaps between epsilons the main table is meant to show (the MLP spread 0.35..0.37).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier

from pipeline import seeds
from pipeline.evaluation.evalnet import TrainConfig, accuracy, fit_classifier
from pipeline.io import Split
from pipeline.stage import PipelineError

log = logging.getLogger(__name__)

CLASSIFIERS = ("logreg", "mlp", "cnn")
#: classifiers whose fit does not depend on the seed: fitted once per evaluation, not once per repeat
DETERMINISTIC = frozenset({"logreg"})


def _pixels(split: Split) -> np.ndarray:
    return split.images.reshape(len(split), -1).astype(np.float32) / 255.0


def _fit_sklearn(kind: str, train: Split, *, seed: int, mlp_hidden: int) -> LogisticRegression | MLPClassifier:
    if kind == "logreg":
        clf = LogisticRegression(max_iter=500, random_state=seed)
    else:
        clf = MLPClassifier(hidden_layer_sizes=(mlp_hidden,), max_iter=200, random_state=seed)
    with warnings.catch_warnings(record=True) as caught:
        # Not converging within the iteration cap is a property of the synthetic data
        # (e.g. noisy or non-separable samples), not an error: log it and score the fit.
        warnings.simplefilter("always", ConvergenceWarning)
        clf.fit(_pixels(train), train.labels)
    if any(issubclass(w.category, ConvergenceWarning) for w in caught):
        log.info("downstream %s: stopped at its iteration cap before converging", kind)
    return clf


def _sklearn_accuracy(clf: LogisticRegression | MLPClassifier, split: Split) -> float:
    return float(np.mean(clf.predict(_pixels(split)) == split.labels))


def downstream_accuracy(train: Split, test: Split, *, classifiers: Sequence[str] = CLASSIFIERS, seed: int = 0,
                        repeats: int = 1, mlp_hidden: int = 256, cnn: TrainConfig = TrainConfig(),
                        device: torch.device = torch.device("cpu"), val: Split | None = None
                        ) -> dict[str, float | None]:
    """Test accuracy ``acc_<classifier>`` of each classifier trained on ``train``, mean over ``repeats`` seeds.

    ``train`` holds synthetic (image, label) pairs, ``test`` real held-out data of the same
    ``[C, H, W]``. Every name of :data:`CLASSIFIERS` gets ``acc_<name>`` and ``acc_<name>_std``
    (sample standard deviation over the repeats; ``None`` for one repeat); classifiers not asked
    for, or a ``train`` without labels (negative: unconditional samples), give ``None``. With
    ``val``, the same classifiers also score it: ``acc_<name>_val`` (mean over the repeats), what a
    rule that chooses among configurations reads instead of ``test``.
    """
    unknown = [c for c in classifiers if c not in CLASSIFIERS]
    if unknown:
        raise PipelineError(f"downstream classifier {unknown[0]!r}: expected one of {', '.join(CLASSIFIERS)}")
    for name, split in (("test", test), ("val", val)):
        if split is not None and train.images.shape[1:] != split.images.shape[1:]:
            raise PipelineError(f"downstream: synthetic images are {list(train.images.shape[1:])} but {name} images "
                                f"{list(split.images.shape[1:])}")
    if repeats < 1:
        raise PipelineError(f"downstream repeats: expected an integer >= 1, got {repeats!r}")
    suffixes = ("", "_std", "_val") if val is not None else ("", "_std")
    out: dict[str, float | None] = {f"acc_{c}{suffix}": None for c in CLASSIFIERS for suffix in suffixes}
    labelled = train.subset(np.flatnonzero(train.labels >= 0))
    if len(labelled) == 0:
        return out
    classes = np.unique(labelled.labels)
    n_classes = int(max(labelled.labels.max(), test.labels.max()) + 1)
    scored = {"test": test} if val is None else {"test": test, "val": val}
    for kind in classifiers:
        accs: dict[str, list[float]] = {k: [] for k in scored}
        for r in range(repeats):
            rep_seed = seeds.seed_of("downstream.classifier", seed, r)
            if r > 0 and kind in DETERMINISTIC:
                for k in scored:
                    accs[k].append(accs[k][0])
            elif len(classes) == 1:
                for k, split in scored.items():
                    accs[k].append(float(np.mean(split.labels == classes[0])))
            elif kind == "cnn":
                model = fit_classifier(labelled, cnn, seed=rep_seed, device=device, n_classes=n_classes,
                                       desc=f"downstream cnn (seed {rep_seed})")
                for k, split in scored.items():
                    accs[k].append(accuracy(model, split))
            else:
                clf = _fit_sklearn(kind, labelled, seed=rep_seed, mlp_hidden=mlp_hidden)
                for k, split in scored.items():
                    accs[k].append(_sklearn_accuracy(clf, split))
        out[f"acc_{kind}"] = float(np.mean(accs["test"]))
        out[f"acc_{kind}_std"] = float(np.std(accs["test"], ddof=1)) if repeats > 1 else None
        if val is not None:
            out[f"acc_{kind}_val"] = float(np.mean(accs["val"]))
        log.info("downstream %s: test accuracy %.4f over %d classifier seed(s) %s", kind, out[f"acc_{kind}"],
                 repeats, np.round(accs["test"], 4).tolist())
    return out


def cnn_config(evaluation: dict) -> TrainConfig:
    """The downstream CNN: the eval net's architecture and optimiser, ``cnn_epochs`` epochs."""
    return replace(TrainConfig.from_mapping(evaluation["evalnet"]), epochs=evaluation["downstream"]["cnn_epochs"])
