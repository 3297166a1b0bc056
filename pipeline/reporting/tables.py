"""Parquet tables: one file per paper table, typed columns, provenance on every row.

Every table carries a ``config_id`` (see :func:`pipeline.config.config_id`) and a ``seed``
column so a number leads back to the run that produced it. Column names carry units
(``fid``, ``eps_upper``, ``wall_s``) and anything that is not a certified bound is named
as an estimate by the table that holds it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io import atomic_path

PROVENANCE_COLUMNS = ("config_id", "seed")


def write_table(df: pd.DataFrame, path: str | Path, *, config_id: str | None = None,
                seed: int | None = None) -> Path:
    """Write ``df`` to ``path`` as Parquet (temp file + rename).

    ``config_id``/``seed`` fill the provenance columns when the frame lacks them; a frame
    that has neither column nor argument is refused, so no table loses its provenance.
    """
    df = df.copy()
    for col, value in (("config_id", config_id), ("seed", seed)):
        if col not in df.columns:
            if value is None:
                raise ValueError(f"table {path}: column {col!r} missing and no {col}= given")
            df[col] = value
    df["config_id"] = df["config_id"].astype("string")
    df["seed"] = df["seed"].astype("int64")
    for col in df.columns:
        if df[col].dtype == object:
            df[col] = df[col].astype("string")
    table = pa.Table.from_pandas(df, preserve_index=False)
    with atomic_path(path, suffix=".parquet") as tmp:
        pq.write_table(table, tmp)
    return Path(path)


def read_table(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: table not found (make it with: snakemake {path})")
    return pd.read_parquet(path)
