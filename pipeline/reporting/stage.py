"""Reporting stages: metric JSONs → Parquet tables, data figures, the results index page."""

from __future__ import annotations

import html
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.io import atomic_path, load_points, load_split, read_json
from pipeline.reporting import verdict
from pipeline.reporting.figures import save_figure
from pipeline.reporting.tables import read_table, write_table
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


def _table_html(path: Path, max_rows: int = 20) -> str:
    df = read_table(path)
    shown = df.head(max_rows)
    more = f"<p>… {len(df) - max_rows} more rows</p>" if len(df) > max_rows else ""
    return shown.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="–", border=0) + more


def _replay_section(inputs: Mapping[str, Path], out: Path) -> str:
    """The replay verdict banner from the one ``.json`` input (the replay report), or a warning if none."""
    reports = {k: Path(v) for k, v in inputs.items() if Path(v).suffix == ".json"}
    if len(reports) > 1:
        raise PipelineError(f"stage index_html: expected one replay report (.json input), got {len(reports)}: "
                            f"{', '.join(reports)}")
    if not reports:
        return verdict.MISSING_HTML
    (path,) = reports.values()
    return verdict.verdict_html(verdict.replay_verdict(read_json(path), path), os.path.relpath(path, out.parent))


def _figure_html(key: str, path: Path, out: Path) -> str:
    rel = os.path.relpath(path, out.parent)
    pdf = os.path.relpath(path.with_suffix(".pdf"), out.parent)
    return (f"<h3>{html.escape(path.stem)}</h3><img src='{html.escape(rel)}' alt='{html.escape(key)}'>"
            f"<p><a href='{html.escape(pdf)}'>PDF</a></p>")


@stage(
    "index_html",
    outputs=("index",),
    any_inputs=True,
    params={"title": "page title", "first": "figure stems shown first, before the tables (the comparison)"},
)
def index_html(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """``results/index.html``: the ledger replay verdict (``--in replay=replay.json``), every table (first
    rows inline, link to the Parquet) and figure."""
    out = Path(outputs["index"])
    parts = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(params.get('title', 'results'))}</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;"
             "font-size:12px}td,th{padding:2px 6px;border-bottom:1px solid #ddd}img{max-width:100%}</style>",
             f"<h1>{html.escape(params.get('title', 'results'))}</h1>", _replay_section(inputs, out)]
    tables = {k: Path(v) for k, v in inputs.items() if Path(v).suffix == ".parquet"}
    figures = {k: Path(v) for k, v in inputs.items() if Path(v).suffix == ".png"}
    first = [str(s) for s in params.get("first", [])]
    if first:  # the figures a reader should see before any table (the cross-method comparison)
        parts.append("<h2>Every method side by side</h2>")
        for key, path in list(figures.items()):
            if path.stem in first:
                parts.append(_figure_html(key, path, out))
                del figures[key]
    parts.append("<h2>Tables</h2>")
    for key, path in tables.items():
        rel = os.path.relpath(path, out.parent)
        parts.append(f"<h3 id='{html.escape(key)}'>{html.escape(path.stem)}</h3>"
                     f"<p><a href='{html.escape(rel)}'>{html.escape(rel)}</a></p>{_table_html(path)}")
    parts.append("<h2>Figures</h2>")
    for key, path in figures.items():
        parts.append(_figure_html(key, path, out))
    with atomic_path(out) as tmp:
        tmp.write_text("\n".join(parts) + "\n")


