"""Reporting stages: metric JSONs → Parquet tables, data figures (the summary page: review.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.io import load_points, load_split, read_json
from pipeline.reporting.figures import save_figure
from pipeline.reporting.tables import write_table
from pipeline.stage import PipelineError, stage


def _flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}_"))
        elif isinstance(value, list):
            flat[name] = ",".join(map(str, value))
        else:
            flat[name] = value
    return flat


@stage(
    "collect_table",
    outputs=("table",),
    any_inputs=True,
    params={
        "config_id": "id of the configuration the rows come from",
        "seed": "seed of the run",
        "rows": "optional {input key: {column: value}} added to each row (e.g. a method label)",
    },
)
def collect_table(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """One Parquet row per input metrics JSON (nested keys flattened with '_'), in input order."""
    if not inputs:
        raise PipelineError("stage collect_table: give at least one --in KEY=metrics.json")
    extra = params.get("rows", {})
    rows = []
    for key, path in inputs.items():
        row = {"row": key, **_flatten(read_json(path)), **extra.get(key, {})}
        rows.append(row)
    write_table(pd.DataFrame(rows), outputs["table"], config_id=params["config_id"], seed=int(params["seed"]))


@stage(
    "data_figure",
    inputs=("private_train", "test"),
    optional_inputs=("public", "toy"),
    outputs=("figure",),
    params={"per_class": "images shown per class (default 4)"},
)
def data_figure(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """A grid of example images per split and class, and the toy mixture, as PNG + PDF."""
    import matplotlib.pyplot as plt

    per_class = int(params.get("per_class", 4))
    panels = [k for k in ("private_train", "test", "public") if k in inputs]
    ncols = len(panels) + ("toy" in inputs)
    fig, axes = plt.subplots(1, ncols, figsize=(3.2 * ncols, 3.6), squeeze=False)
    for ax, key in zip(axes[0], panels):
        split = load_split(inputs[key])
        classes = np.unique(split.labels)[:10]
        rows = []
        for c in classes:
            idx = np.flatnonzero(split.labels == c)[:per_class]
            imgs = split.images[idx].transpose(0, 2, 3, 1)
            rows.append(np.concatenate(list(imgs), axis=1))
        grid = np.concatenate(rows, axis=0)
        ax.imshow(grid.squeeze(-1) if grid.shape[-1] == 1 else grid, cmap="gray", vmin=0, vmax=255)
        ax.set_title(f"{key} (n={len(split)})")
        ax.set_axis_off()
    if "toy" in inputs:
        pts, lab = load_points(inputs["toy"])
        ax = axes[0][-1]
        ax.scatter(pts[:, 0], pts[:, 1], c=lab, s=2, cmap="tab10")
        ax.set_aspect("equal")
        ax.set_title(f"toy mixture (n={len(pts)})")
    save_figure(fig, outputs["figure"])
