"""What a reviewer reads first: the summary page and readable views of every table.

Two stages, both post-processing of finished results (no privacy cost, nothing chosen):

* ``index_html`` writes the summary once, in two wrappings of the same HTML: ``results/index.html``
  (a page of its own) and a fragment that ``snakemake --report`` shows as the report's first page
  (``report/workflow.rst`` includes it). It holds the ledger replay's verdict (every claim
  recomputed: how many, all ok or which failed), the privacy-utility figure, one headline row per
  method (its configuration whose certified eps is nearest ``headline_epsilon``, mean over seeds:
  certified eps, FID, downstream CNN accuracy, the largest one-run audit eps_lb when present) and the
  reference rows (non-private runs: real data, public-only, non-private twins).
* ``report_tables`` renders each Parquet table as a compact HTML view for the report: numbers to 4
  significant digits, long strings replaced by short codes with a legend under the table, columns
  grouped (identifiers, privacy, quality, cost, other). The Parquet keeps full precision.
"""

from __future__ import annotations

import base64
import html
import math
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.io import atomic_path, read_json
from pipeline.reporting import verdict
from pipeline.reporting.tables import read_table
from pipeline.stage import PipelineError, stage

#: strings longer than this wrap in a table view (shorter ones stay on one line)
MAX_CELL_CHARS = 32
#: the one mark of a missing value in a view (None, NaN and pd.NA alike)
MISSING = "–"
#: the column that names a row, the first of these a table has: shown first
NAME_COLUMNS = ("label", "method", "row", "run", "name", "config")
#: the key columns a reader compares, shown right after the row's name in this order: privacy, then utility
KEY_COLUMNS = ("eps_certified", "eps_u", "epsilon_u", "epsilon_lb", "auc", "fid", "fid_mean", "acc_cnn",
               "acc_cnn_mean")
#: report_tables' input key of a table's caption: caption_of_<table>
CAPTION_KEY = "caption_of_"
#: rows shown per table view (the Parquet holds every row)
MAX_ROWS = 200
#: column groups of a table view, matched in order on the column name (first match wins)
COLUMN_GROUPS: tuple[tuple[str, str], ...] = (
    ("run", r"^(method|label|row|name|config|config_id|run|transcript|line|stage|seed|run_seed|rule|job|experiment|"
            r"row_label|cell|p|B|T|beta|K|sampler.*|parameterisation|init|scheme|model)$"),
    ("privacy", r"(eps|epsilon|delta|sigma|noise|accountant|adjacency|mechanism|mu_|q_|sampling|"
                r"clip(?!_fd|_zero_shot)|canar|"
                r"certified|asr|tpr|fpr|auc|under_curve|passed|confidence)"),
    ("quality", r"(fid|kid|precision|recall|acc|consistency|clip_|domain|zero_shot|cos|agree|prob)"),
    ("cost", r"(wall|cpu|rss|seconds|_s$|minutes|utilisation)"),
)
CSS = ("font-family:sans-serif;font-size:13px;line-height:1.35")
TABLE_CSS = ("<style>.dpgen table{border-collapse:collapse;font-size:12px}.dpgen td,.dpgen th{padding:2px 6px;"
             "border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}.dpgen th{background:#f3f3f3}"
             ".dpgen td:first-child,.dpgen th:first-child{text-align:left}"
             ".dpgen td.text{white-space:normal;min-width:14em;max-width:28em;text-align:left}"
             ".dpgen .caption{max-width:70em}.dpgen .note{color:#444;font-size:12px}.dpgen .ok{color:#176117}"
             ".dpgen .bad{color:#a00000}.dpgen img{max-width:100%}.dpgen tr.groups th{text-align:center;"
             "border-left:2px solid #bbb;text-transform:uppercase;font-size:11px}</style>")


# ------------------------------------------------------------------------------------------ summary

def headline_rows(all_runs: pd.DataFrame, epsilon: float) -> pd.DataFrame:
    """One row per private method, from its main configuration only (all_runs' ``headline`` rows: the row its
    paper reports, never an ablation or a diagnostic row): the configuration whose mean certified eps (over
    seeds) is nearest ``epsilon`` on a log scale, with mean FID, CNN accuracy and label consistency and the
    largest audit eps_lb over seeds (NaN: no audited line, not an eps_lb of 0)."""
    private = all_runs[all_runs["private"] & np.isfinite(all_runs["eps_certified"])]
    if "headline" in private.columns:  # tables written before the column existed: every row a candidate
        private = private[private["headline"].astype(bool)]
    columns = ["method", "label", "config", "seeds", "eps_certified", "fid", "acc_cnn", "label_consistency",
               "audit_eps_lb"]
    if private.empty:
        return pd.DataFrame(columns=columns)
    if "label_consistency" not in private.columns:
        private = private.assign(label_consistency=np.nan)
    # a run's name carries its seed (uniform_eps1_seed0, hybrid/p40_B200_T3_beta1_s0, edm_eps1_K4_seed0/churn):
    # the configuration is the name without it
    private = private.assign(config=private["config"].map(without_seed))
    agg = private.groupby(["method", "config"], sort=False).agg(
        label=("label", "first"), seeds=("seed", "nunique"), eps_certified=("eps_certified", "mean"),
        fid=("fid", "mean"), acc_cnn=("acc_cnn", "mean"), label_consistency=("label_consistency", "mean"),
        audit_eps_lb=("audit_eps_lb", lambda s: pd.to_numeric(s, errors="coerce").max())).reset_index()
    agg["distance"] = (np.log(agg["eps_certified"].clip(lower=1e-12)) - math.log(epsilon)).abs()
    best = agg.loc[agg.groupby("method", sort=False)["distance"].idxmin()]
    return best.drop(columns="distance")[columns].reset_index(drop=True)


def methods_without_headline(all_runs: pd.DataFrame) -> list[str]:
    """Private methods whose runs hold no main-configuration row (e.g. STRAIGHTDP without its main row in
    ``straightdp.rows``): the summary names them instead of heading them with an ablation."""
    private = all_runs[all_runs["private"]]
    if "headline" not in private.columns:
        return []
    has = private.groupby("method", sort=False)["headline"].any()
    return [m for m, ok in has.items() if not ok]


def without_seed(config: str) -> str:
    """A run's configuration name without its seed part (``_seed<k>`` or ``_s<k>`` before a ``/`` or the end)."""
    return re.sub(r"_(?:seed|s)\d+(?=/|$)", "", config)


def reference_rows(all_runs: pd.DataFrame) -> pd.DataFrame:
    """The non-private rows (real data, public-only references, non-private twins), mean over seeds."""
    ref = all_runs[~all_runs["private"]]
    if ref.empty:
        return pd.DataFrame(columns=["label", "config", "fid", "acc_cnn"])
    return ref.groupby(["label", "config"], sort=False).agg(fid=("fid", "mean"), acc_cnn=("acc_cnn", "mean")
                                                           ).reset_index()


#: what a configuration file is, as the summary names it (any other file is named by its path: a paper preset)
CONFIG_ROLES = {"config.yaml": "the quick tour, the embedded default",
                "configs/digits_full.yaml": "the reference run of the embedded default"}


def code_commit() -> str:
    """The git commit of the code running now (the ``pipeline`` package's checkout), ``+ local changes`` when its
    tracked files differ from it; ``unknown`` outside a git checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                text=True, timeout=30, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return f"{commit} + local changes" if dirty else commit


def provenance_html(run: Mapping[str, Any], *, commit: str, written: str) -> str:
    """The line under the title that says what was run: configuration files (and their role), ``--config``
    overrides, the whole configuration's id, the seed, and the commit and time this page was written at."""
    files = [str(f) for f in run.get("configfiles", [])]
    named = " + ".join(_mono(f) for f in files) or "unknown"
    # the last file Snakemake merged decides what the run is (config.yaml is always first)
    role = CONFIG_ROLES.get(files[-1], "a paper preset") if files else ""
    overrides = [str(k) for k in run.get("overrides", [])]
    parts = [f"<b>Configuration:</b> {named}" + (f" ({html.escape(role)})" if role else "")]
    if overrides:
        parts.append("<b>--config overrides:</b> " + ", ".join(_mono(k) for k in overrides))
    parts.append(f"<b>config id:</b> {_mono(str(run.get('config_id', 'unknown')))}")
    parts.append(f"<b>seed:</b> {html.escape(str(run.get('seed', 'unknown')))}")
    parts.append(f"<b>page written:</b> {html.escape(written)} by commit {_mono(commit)} "
                 f"(each table names the code that wrote it: {_mono('python -m pipeline which TABLE')})")
    return "<p class='provenance'>" + " · ".join(parts) + "</p>"


def _mono(text: str) -> str:
    """``text`` in a monospace span (not <code>: the report's stylesheet wraps code elements in backticks)."""
    return f"<span style='font-family:monospace'>{html.escape(text)}</span>"


def _png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def _number(v: Any, digits: int = 4) -> str:
    if _is_missing(v):
        return MISSING
    if isinstance(v, (float, np.floating)) and math.isinf(v):
        return "∞" if v > 0 else "-∞"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.{digits}g}"
    return html.escape(str(v))


def _rows_html(df: pd.DataFrame, columns: Mapping[str, str]) -> str:
    head = "".join(f"<th>{html.escape(title)}</th>" for title in columns.values())
    body = "".join("<tr>" + "".join(f"<td>{_number(row[c])}</td>" for c in columns) + "</tr>"
                   for _, row in df.iterrows())
    return f"<table><tr>{head}</tr>{body}</table>"


#: footnote marks of the headline table
NO_LABEL_MARK, NOT_AUDITED = "–¹", "not audited"


def headline_html(headline: pd.DataFrame, missing: Sequence[str]) -> str:
    """The headline table, with what an empty cell means said in its notes: a CNN accuracy the samples cannot
    have (they carry no class label), an audit that did not run (not an eps_lb of 0)."""
    shown = headline.copy()
    unlabelled = ~np.isfinite(shown["acc_cnn"].astype(float)) & ~np.isfinite(shown["label_consistency"].astype(float))
    shown["acc_cnn"] = [NO_LABEL_MARK if u else v for u, v in zip(unlabelled, shown["acc_cnn"])]
    audit = pd.to_numeric(shown["audit_eps_lb"], errors="coerce")
    shown["audit_eps_lb"] = [NOT_AUDITED if not np.isfinite(v) else v for v in audit]
    parts = [_rows_html(shown, {"label": "method (main configuration)", "config": "configuration", "seeds": "seeds",
                                "eps_certified": "certified ε", "fid": "FID", "acc_cnn": "CNN accuracy",
                                "audit_eps_lb": "audit ε_lb (95%)"})]
    notes = ["certified ε: upper bound recomputed from the run's ledger (named accountant), mean over seeds. "
             "FID against real test data (lower is better); CNN accuracy: trained on the samples, tested on real "
             "data. Each method's row is its main configuration (the row its paper reports; ablations are in "
             "their own tables), the one whose certified ε is nearest the headline ε."]
    notes.append("audit ε_lb: empirical lower bound of the one-run canary audit, the largest over the run's "
                 "audited ledger lines; 0 means the audit ran and found no evidence against the claim, "
                 f"“{NOT_AUDITED}” that no line of the run was audited.")
    if unlabelled.any():
        notes.append(f"{NO_LABEL_MARK[-1]} no CNN accuracy: these samples carry no class label (an unconditional "
                     "sampler), and a downstream classifier needs one.")
    if missing:
        notes.append("No main-configuration row (its paper's row is not in this configuration's runs): " +
                     ", ".join(html.escape(m) for m in missing) + ".")
    parts.append("".join(f"<p class='note'>{n}</p>" for n in notes))
    return "\n".join(parts)


def summary_fragment(*, verdict_html: str, figure: Path | None, headline: pd.DataFrame | None,
                     references: pd.DataFrame | None, epsilon: float, provenance: str = "",
                     missing: Sequence[str] = ()) -> str:
    """The summary's HTML fragment (inline styles, the figure embedded): what was run, verdict, plot, headline,
    references."""
    parts = [f"<div class='dpgen' style='{CSS}'>{TABLE_CSS}", provenance, verdict_html]
    if figure is not None:
        parts.append(f"<img src='{_png_data_uri(figure)}' alt='privacy-utility figure' style='max-width:100%'>")
    parts.append(f"<h3>One row per method (its main configuration nearest certified ε = {epsilon:g}, mean over "
                 "seeds)</h3>")
    if headline is None or references is None:
        parts.append("<p class='bad'>no all_runs table given: run the workflow's <code>all</code> target</p>")
    else:
        parts.append(headline_html(headline, missing))
        parts.append("<h3>References (no privacy)</h3>")
        refs = references.assign(acc_cnn=[NO_LABEL_MARK if not np.isfinite(float(v)) else v
                                          for v in references["acc_cnn"]])
        parts.append(_rows_html(refs, {"label": "reference", "config": "configuration", "fid": "FID",
                                       "acc_cnn": "CNN accuracy"}))
        if (refs["acc_cnn"] == NO_LABEL_MARK).any():
            parts.append(f"<p class='note'>{NO_LABEL_MARK[-1]} no CNN accuracy: an unconditional sampler's samples "
                         "carry no class label.</p>")
    parts.append("</div>")
    return "\n".join(parts)


@stage("index_html", optional_inputs=("replay", "all_runs", "figure"), outputs=("index", "fragment"),
       params={"title": "page title", "headline_epsilon": "each method's headline configuration is the one whose "
                                                         "certified eps is nearest this (default 1)",
               "run": "what was run, shown under the title: {configfiles, overrides, config_id, seed}"})
def index_html(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """``results/index.html`` and the report's first page: replay verdict, privacy-utility plot, headline rows
    (``--in replay=replay.json all_runs=all_runs.parquet figure=privacy_utility.png``; a missing one is said)."""
    title = str(params.get("title", "results"))
    epsilon = float(params.get("headline_epsilon", 1.0))
    if not epsilon > 0:
        raise PipelineError(f"stage index_html: headline_epsilon must be > 0, got {epsilon}")
    out = Path(outputs["index"])
    if "replay" in inputs:
        replay = Path(inputs["replay"])
        verdict_html = verdict.verdict_html(verdict.replay_verdict(read_json(replay), replay),
                                            os.path.relpath(replay, out.parent))
    else:
        verdict_html = verdict.MISSING_HTML
    runs = pd.read_parquet(inputs["all_runs"]) if "all_runs" in inputs else None
    written = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    fragment = summary_fragment(verdict_html=verdict_html, figure=inputs.get("figure"),
                                headline=headline_rows(runs, epsilon) if runs is not None else None,
                                references=reference_rows(runs) if runs is not None else None,
                                epsilon=epsilon, missing=methods_without_headline(runs) if runs is not None else (),
                                provenance=provenance_html(params.get("run", {}), commit=code_commit(),
                                                           written=written))
    with atomic_path(Path(outputs["fragment"])) as tmp:
        tmp.write_text(fragment + "\n")
    page = (f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<body style='max-width:1200px;margin:auto'><h1>{html.escape(title)}</h1>{fragment}"
            "<p>Every table and figure, with captions: <code>make report</code> writes <code>results/report.html</code>"
            " (Snakemake's report).</p></body>")
    with atomic_path(out) as tmp:
        tmp.write_text(page + "\n")


# ------------------------------------------------------------------------------------------ table views

def column_group(name: str) -> str:
    """The group a column is shown under (``COLUMN_GROUPS``, else ``other``)."""
    for group, pattern in COLUMN_GROUPS:
        if re.search(pattern, name):
            return group
    return "other"


def _is_missing(v: Any) -> bool:
    """A value that is not there, whatever its type (None, NaN, pd.NA, NaT): every one shows as ``MISSING``."""
    if isinstance(v, str):
        return False
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):  # a list or an array in a cell is a value
        return False


def key_columns(columns: Sequence[str]) -> list[str]:
    """A view's key group: the row's name (the first of ``NAME_COLUMNS`` the table has), then the key columns it
    has (certified eps, FID, accuracy: what a reader compares), in ``KEY_COLUMNS`` order."""
    name = next((c for c in NAME_COLUMNS if c in columns), None)
    return ([name] if name else []) + [c for c in KEY_COLUMNS if c in columns]


def view_columns(columns: Sequence[str]) -> list[str]:
    """The order of a table view's columns: its key group (:func:`key_columns`), then the rest grouped
    (identifiers, privacy, quality, cost, other)."""
    key = key_columns(columns)
    order = ["run", "privacy", "quality", "cost", "other"]
    return key + sorted((c for c in columns if c not in key), key=lambda c: order.index(column_group(c)))


def caption_html(rst: str) -> str:
    """A report caption (reStructuredText, ``report/captions``) as HTML, by docutils (Snakemake's own renderer of
    captions); problems in the markup are left in the text rather than reported."""
    from docutils.core import publish_parts

    return publish_parts(rst, writer="html5",
                         settings_overrides={"report_level": 5, "halt_level": 5, "input_encoding": "unicode",
                                             "output_encoding": "unicode"})["body"]


def table_view(df: pd.DataFrame, *, max_rows: int = MAX_ROWS, caption: str | None = None) -> str:
    """A readable HTML view of a table: its caption above, the row's name and the key columns first, the other
    columns grouped, numbers to 4 significant digits, text in full (wrapped), one mark for a missing value."""
    columns = view_columns(list(df.columns))
    n_key = len(key_columns(columns))
    groups: list[tuple[str, int]] = []
    for i, c in enumerate(columns):
        g = "key" if i < n_key else column_group(c)
        if groups and groups[-1][0] == g:
            groups[-1] = (g, groups[-1][1] + 1)
        else:
            groups.append((g, 1))

    def cell(v: Any) -> str:
        if isinstance(v, str) and len(v) > MAX_CELL_CHARS:
            return f"<td class='text'>{html.escape(v)}</td>"
        return f"<td>{_number(v)}</td>"

    shown = df[columns].head(max_rows)
    rows = "".join("<tr>" + "".join(cell(row[c]) for c in columns) + "</tr>" for _, row in shown.iterrows())
    parts = [f"<div class='dpgen' style='{CSS}'>{TABLE_CSS}"]
    if caption:
        parts.append(f"<div class='caption'>{caption_html(caption)}</div>")
    parts += ["<table><tr class='groups'>" + "".join(f"<th colspan='{n}'>{g}</th>" for g, n in groups) + "</tr>",
              "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in columns) + "</tr>", rows, "</table>"]
    if len(df) > max_rows:
        parts.append(f"<p>… {len(df) - max_rows} more rows in the Parquet file</p>")
    if shown.map(_is_missing).to_numpy().any():
        parts.append(f"<p class='note'>{MISSING} no value: not measured in this configuration, or it does not apply "
                     "to the row (the column's description: the caption above, docs/results.md).</p>")
    parts.append("</div>")
    return "\n".join(parts)


@stage("report_tables", outputs=("dir",), any_inputs=True, params={})
def report_tables(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """One HTML view ``<dir>/<key>.html`` per input table (``--in NAME=table.parquet``) for the report, its caption
    above it when given (``--in caption_of_NAME=NAME.rst``)."""
    tables = {k: v for k, v in inputs.items() if not k.startswith(CAPTION_KEY)}
    if not tables:
        raise PipelineError("stage report_tables: give at least one --in NAME=table.parquet")
    out = Path(outputs["dir"])
    out.mkdir(parents=True, exist_ok=True)
    for key, path in tables.items():
        caption = inputs.get(f"{CAPTION_KEY}{key}")
        body = table_view(read_table(path), caption=Path(caption).read_text() if caption else None)
        view = f"<!doctype html><meta charset='utf-8'><title>{html.escape(key)}</title>{body}"
        with atomic_path(out / f"{key}.html") as tmp:
            tmp.write_text(view + "\n")
