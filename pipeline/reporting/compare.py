"""Compare two runs' Parquet tables: what a refactor must leave unchanged ("a refactor changes no number").

``python -m pipeline.reporting.compare BEFORE/results/tables AFTER/results/tables`` reads every table both folders
hold and compares them exactly (pandas ``assert_frame_equal``, ``check_exact``: same columns, same dtypes, same
values, NaN equal to NaN), leaving out what measures a job's cost rather than computes a result: columns whose name
ends like a measured cost (:data:`MEASURED_SUFFIXES`) and tables that are nothing but costs (:data:`MEASURED_TABLES`). It prints one line per table and exits 1 when a table differs or is missing on one side.

``--shared-columns`` is for a change of presentation (a column added, dropped or retyped, no number moved): only the
columns both sides hold are compared, by value (an integer column equal to the float one it replaced is equal),
and each table's line names the columns added and removed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

#: tables that hold only the jobs' measured costs (one row per job): never equal between two runs
MEASURED_TABLES = ("runtime",)
#: columns that measure a job rather than compute a result, by the end of their name: every duration in seconds
#: (``*_s``: wall_s, cpu_s, all_runs' cost_wall_s, SENSGEO's primal_solver_s, DPDM's calibration_s), memory
#: (``*max_rss_mb``), CPU use and the time a job finished
MEASURED_SUFFIXES = ("_s", "max_rss_mb", "cpu_utilisation", "finished_utc")


def is_measured(column: str) -> bool:
    return column.endswith(MEASURED_SUFFIXES) or "_s_this_run" in column


@dataclass(frozen=True)
class TableDiff:
    """One table's verdict: ``equal``, ``differs`` (with the first difference pandas names) or ``missing``."""

    name: str
    status: str
    detail: str = ""
    ignored: tuple[str, ...] = ()

    def line(self) -> str:
        ignored = f" (measured columns left out: {', '.join(self.ignored)})" if self.ignored else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.status:8s} {self.name}{detail}{ignored}"


def compare_table(name: str, before: pd.DataFrame, after: pd.DataFrame, *,
                  shared_columns: bool = False) -> TableDiff:
    """Exact comparison of one table, its measured columns left out (``shared_columns``: only the columns both
    hold, by value whatever their dtype, the others named)."""
    ignored = tuple(sorted({c for c in (*before.columns, *after.columns) if is_measured(str(c))}))
    a, b = before.drop(columns=[c for c in ignored if c in before]), after.drop(columns=[c for c in ignored if c in after])
    changed = ""
    if shared_columns:
        added, removed = [c for c in b.columns if c not in a.columns], [c for c in a.columns if c not in b.columns]
        a, b = a[[c for c in a.columns if c in b.columns]], b[[c for c in a.columns if c in b.columns]]
        changed = "".join(f"; {what}: {', '.join(map(str, cols))}" for what, cols in (("added", added),
                                                                                     ("removed", removed)) if cols)
    try:
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_exact=True,
                                      check_dtype=not shared_columns)
    except AssertionError as exc:
        first = " ".join(str(exc).split())[:300]
        return TableDiff(name, "differs", first + changed, ignored)
    return TableDiff(name, "equal", f"{len(a)} rows x {a.shape[1]} columns{changed}", ignored)


def compare_folders(before: Path, after: Path, *, shared_columns: bool = False) -> list[TableDiff]:
    """Every table of either folder, by name; tables of measured costs only are skipped."""
    names = sorted({p.stem for p in (*before.glob("*.parquet"), *after.glob("*.parquet"))})
    out = []
    for name in names:
        if name in MEASURED_TABLES:
            out.append(TableDiff(name, "skipped", "measured costs only"))
            continue
        a, b = before / f"{name}.parquet", after / f"{name}.parquet"
        if not (a.is_file() and b.is_file()):
            out.append(TableDiff(name, "missing", f"only in {a.parent if a.is_file() else b.parent}"))
            continue
        out.append(compare_table(name, pd.read_parquet(a), pd.read_parquet(b), shared_columns=shared_columns))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="a results/tables folder")
    parser.add_argument("after", type=Path, help="another results/tables folder")
    parser.add_argument("--shared-columns", action="store_true",
                        help="compare only the columns both sides hold, by value; name the columns added and removed")
    args = parser.parse_args(argv)
    for folder in (args.before, args.after):
        if not folder.is_dir():
            parser.error(f"{folder}: expected a folder of .parquet tables")
    diffs = compare_folders(args.before, args.after, shared_columns=args.shared_columns)
    for d in diffs:
        print(d.line())
    bad = [d for d in diffs if d.status in ("differs", "missing")]
    print(f"{len(diffs) - len(bad)} of {len(diffs)} tables equal or skipped; {len(bad)} differ or are missing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
