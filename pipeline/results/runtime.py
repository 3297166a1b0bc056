"""Where the time goes: ``runtime.parquet`` and the top-rules figure, from Snakemake's own benchmark files.

Every rule declares ``benchmark: benchmark_path(rule, name)`` (``rules/common.smk``), so each job that
ran leaves ``<benchmarks>/<rule>/<name>.tsv`` (wall s, CPU s, max RSS; Snakemake's columns). The
``runtime_table`` stage reads them all: one row per job, the last line of its file (a job that was
re-run overwrites its file). ``all_runs.parquet`` takes its cost columns from this table.

What it cannot hold: the jobs that run after it (the table itself, ``all_runs``, the figures and the
index page, a few seconds each) and, for a job whose output was already up to date, any newer cost
(its file is the one of the run that made the output).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.reporting.figures import save_figure
from pipeline.reporting.tables import write_table
from pipeline.stage import PipelineError, stage

#: runtime.parquet's columns: seconds, megabytes (Snakemake's max_rss is in MB), UTC time of the file
COLUMNS = ("rule", "job", "benchmark", "wall_s", "cpu_s", "cpu_utilisation", "max_rss_mb", "finished_utc")


def _number(row: pd.Series, column: str) -> float:
    """A column of the benchmark line as a float; NaN where absent or Snakemake wrote '-'."""
    return float(pd.to_numeric(row.get(column, math.nan), errors="coerce"))


def benchmark_row(path: Path, root: Path) -> dict[str, Any]:
    """One job's cost from its benchmark TSV under ``root`` (``<rule>/<job>.tsv``): the file's last line."""
    rel = path.relative_to(root)
    try:
        df = pd.read_csv(path, sep="\t")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise PipelineError(f"{path}: not a Snakemake benchmark file ({exc})") from None
    if df.empty or "s" not in df.columns:
        raise PipelineError(f"{path}: not a Snakemake benchmark file (expected a header with column 's')")
    last = df.iloc[-1]
    wall, cpu = _number(last, "s"), _number(last, "cpu_time")
    finished = datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc).isoformat(timespec="seconds")
    return {"rule": rel.parts[0], "job": str(Path(*rel.parts[1:]).with_suffix("")) if len(rel.parts) > 1 else "",
            "benchmark": os.path.normpath(path), "wall_s": wall, "cpu_s": cpu,
            "cpu_utilisation": cpu / wall if wall > 0 else math.nan, "max_rss_mb": _number(last, "max_rss"),
            "finished_utc": finished}


def runtime_frame(root: Path | None) -> pd.DataFrame:
    """Every benchmark file under ``root``, one row per job, sorted by rule then job (no row without it)."""
    rows = [benchmark_row(p, root) for p in sorted(root.rglob("*.tsv"))] if root and root.is_dir() else []
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    return df.astype({"rule": str, "job": str, "benchmark": str, "wall_s": float, "cpu_s": float,
                      "cpu_utilisation": float, "max_rss_mb": float, "finished_utc": str})


def job_cost(runtime: pd.DataFrame, benchmarks: Sequence[str | Path]) -> dict[str, float]:
    """Cost of a run made by the jobs whose benchmark files are ``benchmarks``: summed wall and CPU seconds,
    the largest max RSS. NaN when none is declared or one is not in ``runtime`` (a job that ran before
    benchmarks were declared)."""
    unknown = {"cost_wall_s": math.nan, "cost_cpu_s": math.nan, "cost_max_rss_mb": math.nan}
    if not benchmarks:
        return unknown
    by_path = runtime.set_index("benchmark")
    keys = [os.path.normpath(p) for p in benchmarks]
    if any(k not in by_path.index for k in keys):
        return unknown
    jobs = by_path.loc[keys]
    return {"cost_wall_s": float(jobs["wall_s"].sum()), "cost_cpu_s": float(jobs["cpu_s"].sum()),
            "cost_max_rss_mb": float(jobs["max_rss_mb"].max())}


@stage("runtime_table", outputs=("table",), any_inputs=True,
       params={"benchmarks": "the directory of Snakemake benchmark files (<rule>/<job>.tsv)",
               "seed": "the config's seed (provenance column)", "config_id": "id of the settings"})
def runtime_table(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """runtime.parquet: one row per job that left a benchmark file (rule, job, wall s, CPU s, max RSS MB).
    ``--in`` files only order the job after the work it measures; they are not read."""
    if "benchmarks" not in params:
        raise PipelineError("stage runtime_table: params.benchmarks (the benchmark directory) is required")
    df = runtime_frame(Path(params["benchmarks"]))
    if df.empty:
        raise PipelineError(f"stage runtime_table: no benchmark file under {params['benchmarks']} "
                            f"(every rule declares benchmark: benchmark_path(rule, name))")
    write_table(df, outputs["table"], config_id=str(params.get("config_id", "unknown")),
                seed=int(params.get("seed", 0)))


def jobs_phrase(n: int) -> str:
    """``1 job``, ``3 jobs``: a count as the figure says it."""
    return f"{n} job" if n == 1 else f"{n} jobs"


def by_rule(df: pd.DataFrame) -> pd.DataFrame:
    """Jobs, wall s, CPU s and the largest RSS summed per rule, most wall time first."""
    g = df.groupby("rule").agg(jobs=("job", "size"), wall_s=("wall_s", "sum"), cpu_s=("cpu_s", "sum"),
                               max_rss_mb=("max_rss_mb", "max"))
    return g.sort_values("wall_s", ascending=False)


def runtime_figure_of(df: pd.DataFrame, top: int = 12) -> Any:
    """Horizontal bars of the ``top`` rules by summed job wall time, CPU time beside, jobs and RSS annotated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = by_rule(df)
    shown = g.head(top).iloc[::-1]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(shown) + 2))
    y = range(len(shown))
    ax.barh([v + 0.2 for v in y], shown["wall_s"] / 60, height=0.4, label="wall (job-minutes)", color="tab:blue")
    ax.barh([v - 0.2 for v in y], shown["cpu_s"] / 60, height=0.4, label="CPU (minutes)", color="tab:orange")
    ax.set_yticks(list(y))
    ax.set_yticklabels(shown.index)
    for v, (_, r) in zip(y, shown.iterrows()):
        rss = r["max_rss_mb"]
        peak = f"peak RSS {rss / 1024:.1f} GiB" if math.isfinite(rss) else "peak RSS not measured"
        ax.annotate(f" {jobs_phrase(int(r['jobs']))}, {peak}",
                    (max(r["wall_s"], r["cpu_s"]) / 60, v), va="center", fontsize=8)
    ax.set_xlabel("minutes, summed over the rule's jobs")
    total_wall, total_cpu = g["wall_s"].sum() / 60, g["cpu_s"].sum() / 60
    ax.set_title(f"Where the time goes: top {len(shown)} of {len(g)} rules by job wall time\n"
                 f"({jobs_phrase(len(df))}, {total_wall:.1f} job-minutes wall, {total_cpu:.1f} CPU-minutes)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


@stage("runtime_figure", inputs=("table",), outputs=("figure",))
def runtime_figure(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """results/figures/runtime.png (+ PDF): the rules that cost the most job time."""
    df = pd.read_parquet(inputs["table"])
    if df.empty:
        raise PipelineError(f"stage runtime_figure: {inputs['table']} holds no jobs")
    save_figure(runtime_figure_of(df), outputs["figure"])
