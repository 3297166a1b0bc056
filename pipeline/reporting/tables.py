"""Parquet tables: one file per paper table, typed columns, provenance on every row.

Every table carries a ``config_id`` (see :func:`pipeline.config.config_id`) and a ``seed`` column (``seeds``
where its rows are means over seeds) so a number leads back to the run that produced it, and names the stage
and code that wrote it in its Parquet metadata (``python -m pipeline which TABLE``: a table's name to its code
in one hop). Column names carry units (``fid``, ``eps_upper``, ``wall_s``) and anything that is not a certified
bound is named as an estimate by the table that holds it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io import atomic_path
from pipeline.stage import running_stage

PROVENANCE_COLUMNS = ("config_id", "seed")
#: the Parquet schema-metadata key holding which stage wrote a table: {"stage", "code", "source"}
MADE_BY_KEY = b"dpgen.made_by"


def write_table(df: pd.DataFrame, path: str | Path, *, config_id: str | None = None,
                seed: int | None = None) -> Path:
    """Write ``df`` to ``path`` as Parquet (temp file + rename).

    ``config_id``/``seed`` fill the provenance columns when the frame lacks them; a frame
    that has neither column nor argument is refused, so no table loses its provenance. A table
    whose rows are aggregates over seeds names them in a ``seeds`` column instead of one ``seed``
    (a single seed on a mean over three would say something false).
    """
    df = df.copy()
    over_seeds = "seeds" in df.columns and "seed" not in df.columns and seed is None
    for col, value in (("config_id", config_id), ("seed", seed)):
        if col not in df.columns and not (col == "seed" and over_seeds):
            if value is None:
                raise ValueError(f"table {path}: column {col!r} missing and no {col}= given")
            df[col] = value
    df["config_id"] = df["config_id"].astype("string")
    if not over_seeds:
        df["seed"] = df["seed"].astype("int64")
    for col in df.columns:
        if df[col].dtype == object:
            df[col] = df[col].astype("string")
    table = pa.Table.from_pandas(df, preserve_index=False)
    spec = running_stage()
    if spec is not None:
        made_by = {"stage": spec.name, "code": spec.code, "source": spec.source}
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), MADE_BY_KEY: json.dumps(made_by)})
    with atomic_path(path, suffix=".parquet") as tmp:
        pq.write_table(table, tmp)
    return Path(path)


def unmeasured_columns(tables: dict[str, pd.DataFrame]) -> list[tuple[str, str]]:
    """(table, column) pairs where the column is empty (every row missing) in that table while another table has a
    value under the same name: a column a reader would take for measured-but-missing. A column empty everywhere
    (a metric this configuration does not compute, e.g. CLIP when it is off) is not listed."""
    empty = {(name, c) for name, df in tables.items() for c in df.columns if len(df) and df[c].isna().all()}
    measured = {c for df in tables.values() for c in df.columns if df[c].notna().any()}
    return sorted((name, c) for name, c in empty if c in measured)


def read_table(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: table not found (make it with: snakemake {path})")
    return pd.read_parquet(path)


def made_by(path: str | Path) -> dict[str, str] | None:
    """Which stage wrote the table at ``path`` ({"stage", "code", "source"}), or None for one written outside a stage
    (or before tables named their maker)."""
    metadata = pq.read_schema(path).metadata or {}
    return json.loads(metadata[MADE_BY_KEY]) if MADE_BY_KEY in metadata else None


def which_main(argv: list[str] | None = None) -> int:
    """``python -m pipeline which TABLE...``: the stage and code that wrote each table, and how to rebuild it."""
    parser = argparse.ArgumentParser(prog="python -m pipeline which",
                                     description="The stage and code that wrote each Parquet table.")
    parser.add_argument("tables", nargs="+", type=Path, metavar="TABLE", help="a .parquet file under results/")
    args = parser.parse_args(argv)
    status = 0
    for path in args.tables:
        if not path.is_file():
            print(f"{path}: no such table (make it with: snakemake {path})")
            status = 1
            continue
        who = made_by(path)
        if who is None:
            print(f"{path}: names no stage (written outside a stage, or before tables named their maker)")
            status = 1
            continue
        print(f"{path}\n  stage  {who['stage']}  (python -m pipeline {who['stage']} --help)\n"
              f"  code   {who['code']}  ({who['source']})")
        if (now := current_code(who["stage"])) not in (None, who["code"]):
            print(f"  now    {now}  (the stage's code moved since the table was written)")
        print(f"  rebuild: snakemake --cores 1 --force {path}")
    return status


def current_code(stage_name: str) -> str | None:
    """``module:function`` the CLI runs for ``stage_name`` today (``python -m pipeline``'s stages), or None for a
    stage it does not know."""
    from pipeline.cli import STAGES  # the CLI's table of stages: the house's and every method's

    return STAGES.get(stage_name)
