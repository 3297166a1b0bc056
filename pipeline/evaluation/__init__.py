"""Evaluation core shared by every method: eval net, torch-fidelity metrics, downstream accuracy.

Public API (imported lazily, so ``python -m pipeline STAGE --help`` stays fast):

* :func:`evaluate` — every metric of a split of samples against the real test split, as the
  flat dict the ``evaluate_samples`` stage writes (the call a method's own code should use);
* :func:`fidelity_metrics` — FID, KID, precision/recall (+ per-class FID) via torch-fidelity
  in the eval-net or ``inception-v3-compat`` feature space;
* :func:`label_consistency`, :func:`per_class_fid` — the label-aware metrics;
* :func:`downstream_accuracy` — logistic regression / MLP / CNN trained on synthetic pairs,
  tested on real data;
* :class:`EvalNet`, :class:`TrainConfig`, :func:`fit_classifier`, :func:`load_evalnet`,
  :func:`predict` — the evaluation CNN (also the classifier of EMPDEN's critical-window
  diagnostic on the embedded default);
* stages ``train_evalnet`` and ``evaluate_samples``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EvalNet": "evalnet", "TrainConfig": "evalnet", "fit_classifier": "evalnet", "load_evalnet": "evalnet",
    "predict": "evalnet", "accuracy": "evalnet", "train_evalnet": "evalnet",
    "fidelity_metrics": "fidelity", "per_class_fid": "fidelity", "label_consistency": "fidelity",
    "EvalNetFeatureExtractor": "fidelity", "EVALNET_EXTRACTOR": "fidelity",
    "downstream_accuracy": "downstream",
    "evaluate": "stage", "evaluate_samples": "stage",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
