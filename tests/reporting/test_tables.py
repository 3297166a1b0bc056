"""Parquet tables: typed, atomic, and never without provenance."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipeline.reporting import read_table, write_table
from pipeline.reporting.tables import made_by, unmeasured_columns, which_main
from pipeline.stage import running_stage, stage


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


def test_rows_that_are_means_over_seeds_name_them_instead_of_one_seed(tmp_path):
    back = read_table(write_table(pd.DataFrame({"x": [1.0], "seeds": ["0,1,2"]}), tmp_path / "t.parquet",
                                  config_id="c"))
    assert "seed" not in back.columns and back["seeds"].tolist() == ["0,1,2"]
    with pytest.raises(ValueError, match="seed"):  # neither a seed nor the seeds: refused as before
        write_table(pd.DataFrame({"x": [1.0]}), tmp_path / "u.parquet", config_id="c")


def test_a_column_empty_in_one_table_but_measured_in_another_is_found():
    tables = {"a": pd.DataFrame({"fid": [1.0, 2.0], "clip_fd": [None, None]}),
              "b": pd.DataFrame({"fid": [float("nan")], "cost_wall_s": [float("nan")], "clip_fd": [float("nan")]}),
              "c": pd.DataFrame({"cost_wall_s": [3.0, float("nan")]})}
    assert unmeasured_columns(tables) == [("b", "cost_wall_s"), ("b", "fid")]  # clip_fd: off everywhere
    assert unmeasured_columns({"a": tables["a"], "c": tables["c"]}) == []


def test_missing_table_says_how_to_make_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="snakemake .*nope.parquet"):
        read_table(tmp_path / "nope.parquet")


# ---------------------------------------------------------------------------------------------- which stage wrote it


@stage("toy_table", outputs=("table",))
def toy_table(inputs, outputs, params):
    """A stage that writes one table."""
    write_table(pd.DataFrame({"x": [1]}), outputs["table"], config_id="c", seed=0)


def test_a_table_names_the_stage_and_code_that_wrote_it(tmp_path):
    toy_table({}, {"table": tmp_path / "t.parquet"}, {})
    who = made_by(tmp_path / "t.parquet")
    assert who["stage"] == "toy_table" and who["code"] == f"{__name__}:toy_table"
    path, line = who["source"].rsplit(":", 1)
    # inspect gives the decorator's line; the def follows it
    assert path == "tests/reporting/test_tables.py"
    assert Path(__file__).read_text().splitlines()[int(line)].startswith("def toy_table(")
    # the pandas metadata is kept beside it: the frame reads back as written
    assert read_table(tmp_path / "t.parquet")["x"].tolist() == [1]


def test_a_table_written_outside_a_stage_names_none(tmp_path):
    write_table(pd.DataFrame({"x": [1]}), tmp_path / "t.parquet", config_id="c", seed=0)
    assert made_by(tmp_path / "t.parquet") is None and running_stage() is None


def test_which_prints_the_stage_its_code_and_how_to_rebuild(tmp_path, capsys):
    toy_table({}, {"table": tmp_path / "t.parquet"}, {})
    assert which_main([str(tmp_path / "t.parquet")]) == 0
    out = capsys.readouterr().out
    assert "stage  toy_table  (python -m pipeline toy_table --help)" in out
    assert f"code   {__name__}:toy_table  (tests/reporting/test_tables.py:" in out
    assert f"rebuild: snakemake --cores 1 --force {tmp_path / 't.parquet'}" in out
    assert which_main([str(tmp_path / "none.parquet")]) == 1
    assert "no such table" in capsys.readouterr().out


def test_which_names_where_a_stages_code_is_now_when_it_moved_since_the_table(tmp_path, capsys, monkeypatch):
    import pipeline.cli

    toy_table({}, {"table": tmp_path / "t.parquet"}, {})
    monkeypatch.setitem(pipeline.cli.STAGES, "toy_table", "pipeline.methods.toy.tables:toy_table")
    assert which_main([str(tmp_path / "t.parquet")]) == 0
    out = capsys.readouterr().out
    assert f"code   {__name__}:toy_table" in out  # what wrote it
    assert "now    pipeline.methods.toy.tables:toy_table  (the stage's code moved" in out
    monkeypatch.setitem(pipeline.cli.STAGES, "toy_table", f"{__name__}:toy_table")
    which_main([str(tmp_path / "t.parquet")])
    assert "now " not in capsys.readouterr().out  # not moved: nothing more
