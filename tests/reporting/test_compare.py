"""Comparing two runs' tables (pipeline/reporting/compare.py): exact on every computed column, blind to measured costs."""

from __future__ import annotations

import math

import pandas as pd

from pipeline.reporting.compare import compare_folders, compare_table, is_measured, main


def table(**over) -> pd.DataFrame:
    cols = {"run": ["a", "b"], "eps_certified": [0.3, 1.0], "fid": [80.5, math.nan], "cost_wall_s": [12.0, 30.0]}
    return pd.DataFrame({**cols, **over})


def test_equal_tables_are_equal_whatever_their_measured_costs():
    d = compare_table("t", table(), table(cost_wall_s=[99.0, 1.0]))
    assert d.status == "equal" and d.ignored == ("cost_wall_s",)
    assert d.line().startswith("equal    t: 2 rows x 3 columns")


def test_one_computed_value_off_by_one_ulp_differs():
    d = compare_table("t", table(), table(eps_certified=[0.3, math.nextafter(1.0, 2.0)]))
    assert d.status == "differs" and "eps_certified" in d.detail


def test_a_column_or_a_dtype_changed_differs():
    assert compare_table("t", table(), table().drop(columns="fid")).status == "differs"
    assert compare_table("t", table(), table(run=pd.Series(["a", "b"], dtype="category"))).status == "differs"


def test_a_change_of_presentation_compares_the_shared_columns_by_value_and_names_the_rest():
    before = table(n=[10.0, 20.0], seed=[0, 0])
    after = table(n=pd.array([10, 20], dtype="Int64"), headline=[True, False]).assign(fid=[80.5, math.nan])
    d = compare_table("t", before, after, shared_columns=True)
    assert d.status == "equal" and d.detail == "2 rows x 4 columns; added: headline; removed: seed"
    moved = compare_table("t", before, after.assign(n=pd.array([10, 21], dtype="Int64")), shared_columns=True)
    assert moved.status == "differs" and "added: headline" in moved.detail  # a number moved: still caught
    assert compare_table("t", before, after).status == "differs"  # without the flag: exact as before


def test_what_counts_as_measured():
    assert all(map(is_measured, ("wall_s", "cpu_s", "cost_cpu_s", "cost_max_rss_mb", "primal_wall_s",
                                 "primal_solver_s", "wall_s_this_run")))
    assert not any(map(is_measured, ("eps_certified", "fid", "sigma", "n_steps")))


def test_two_folders_table_by_table_and_the_exit_status(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    for folder in (a, b):
        table().to_parquet(folder / "same.parquet")
        pd.DataFrame({"wall_s": [1.0]}).to_parquet(folder / "runtime.parquet")
    table().to_parquet(a / "only_a.parquet")
    assert {d.name: d.status for d in compare_folders(a, b)} == {"only_a": "missing", "runtime": "skipped",
                                                                  "same": "equal"}
    assert main([str(a), str(b)]) == 1
    (a / "only_a.parquet").unlink()
    assert main([str(a), str(b)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "2 of 2 tables equal or skipped; 0 differ or are missing"
