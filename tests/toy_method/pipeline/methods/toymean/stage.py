"""The toy method's two stages: the release (samples and a ledger line) and its table."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import seeds
from pipeline.io import Split, atomic_path, save_split
from pipeline.privacy import ledger, toymean
from pipeline.reporting.tables import write_table
from pipeline.results.all_runs import checked_runs, run_rows
from pipeline.stage import stage
from pipeline.training.data import check_declared, declared_private, load_training_split


@stage("toymean_release", inputs=("data",), outputs=("samples", "ledger"),
       params={"sigma": "noise multiplier", "delta": "delta", "seed": "seed", "config_id": "id",
               "private": "declared N and classes", ledger.BINDING_PARAM: ledger.BINDING_DOC})
def toymean_release(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    N, n_classes = declared_private(params, "toymean_release")
    split, sha = load_training_split(inputs["data"], "data")
    binding = ledger.binding_of(params, data_sha256=sha, stage="toymean_release")
    check_declared(split, N=N, n_classes=n_classes, stage="toymean_release")
    plan = toymean.Plan(sigma=float(params["sigma"]), N=N, delta=float(params["delta"]))
    shape = split.images.shape[1:]
    x = split.images.reshape(len(split.images), -1).astype(np.float64) / 255.0
    rng = seeds.numpy_rng("toymean.noise", int(params["seed"]))  # its declared stream (streams.py)
    means = toymean.release(x, split.labels.astype(int), n_classes, plan, rng)
    # a class's mean image from its released sum: the classes are taken as balanced (a public assumption)
    images = np.clip(means * n_classes * 255.0 * np.sqrt(x.shape[1]), 0, 255).astype(np.uint8)
    labels = np.repeat(np.arange(n_classes), 10)
    save_split(outputs["samples"], Split(images[labels].reshape(len(labels), *shape), labels),
               name="toymean", source="toymean", seed=int(params["seed"]))
    entry = toymean.ledger_entry(plan, stage="toymean_release", config_id=str(params["config_id"]),
                                 seed=int(params["seed"]))
    with atomic_path(outputs["ledger"], suffix=".jsonl") as tmp:
        ledger.append_entry(tmp, entry, binding)


@stage("toymean_table", outputs=("table",), any_inputs=True, params={"runs": "the runs", "config_id": "id"})
def toymean_table(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    df = run_rows(inputs, checked_runs(params))
    write_table(df.drop(columns=["in_figure", "headline"]), outputs["table"], config_id=str(params.get("config_id", "unknown")))
