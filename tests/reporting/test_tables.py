"""Parquet tables: typed, atomic, and never without provenance."""

from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipeline.reporting import read_table, write_table


def test_table_carries_provenance_and_types(tmp_path):
    path = write_table(pd.DataFrame({"method": ["a", "b"], "fid": [1.5, 2.0], "n": [3, 4]}),
                       tmp_path / "t.parquet", config_id="abc123", seed=0)
    schema = pq.read_schema(path)
    assert str(schema.field("fid").type) == "double"
    assert str(schema.field("n").type) == "int64"
    assert str(schema.field("method").type) in ("string", "large_string")
    df = read_table(path)
    assert df["config_id"].tolist() == ["abc123", "abc123"] and df["seed"].tolist() == [0, 0]


def test_table_without_provenance_is_refused(tmp_path):
    with pytest.raises(ValueError, match="config_id"):
        write_table(pd.DataFrame({"x": [1]}), tmp_path / "t.parquet", seed=0)
    assert not (tmp_path / "t.parquet").exists()


def test_existing_provenance_columns_are_kept(tmp_path):
    df = pd.DataFrame({"x": [1, 2], "config_id": ["a", "b"], "seed": [0, 1]})
    back = read_table(write_table(df, tmp_path / "t.parquet"))
    assert back["config_id"].tolist() == ["a", "b"] and back["seed"].tolist() == [0, 1]


def test_missing_table_says_how_to_make_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="snakemake .*nope.parquet"):
        read_table(tmp_path / "nope.parquet")
