"""Reporting stages: metrics JSON → Parquet rows, figures as PNG+PDF, the index page."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from pipeline.io import Split, save_points, save_split, write_json
from pipeline.reporting import read_table, save_figure
from pipeline.reporting.stage import collect_table, data_figure


def test_collect_table_flattens_one_row_per_input(tmp_path):
    write_json(tmp_path / "a.json", {"fid": 1.0, "per_class_fid": {"0": 2.0, "1": 3.0}})
    write_json(tmp_path / "b.json", {"fid": 5.0, "per_class_fid": {"0": 6.0, "1": 7.0}})
    collect_table({"a": tmp_path / "a.json", "b": tmp_path / "b.json"}, {"table": tmp_path / "t.parquet"},
                  {"config_id": "cid", "seed": 3, "rows": {"a": {"method": "real"}}})
    df = read_table(tmp_path / "t.parquet")
    assert df["row"].tolist() == ["a", "b"]
    assert df["per_class_fid_1"].tolist() == [3.0, 7.0]
    assert df["method"].tolist()[0] == "real"
    assert set(df["config_id"]) == {"cid"} and set(df["seed"]) == {3}


def test_save_figure_writes_png_and_pdf(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    png, pdf = save_figure(fig, tmp_path / "f.png")
    assert png.read_bytes()[:4] == b"\x89PNG" and pdf.read_bytes()[:4] == b"%PDF"


def test_data_figure_and_collect_table(tmp_path):
    rng = np.random.default_rng(0)
    split = Split(rng.integers(0, 255, (20, 1, 8, 8), dtype=np.uint8), np.arange(20) % 10)
    for name in ("private_train", "test"):
        save_split(tmp_path / f"{name}.npz", split, name=name, source="unit", seed=0)
    save_points(tmp_path / "toy.npz", rng.standard_normal((50, 2)), np.zeros(50), name="toy", source="unit", seed=0)
    data_figure({"private_train": tmp_path / "private_train.npz", "test": tmp_path / "test.npz",
                 "toy": tmp_path / "toy.npz"}, {"figure": tmp_path / "fig" / "data.png"}, {})
    assert (tmp_path / "fig" / "data.pdf").is_file()
    write_json(tmp_path / "m.json", {"fid": 1.25})
    collect_table({"r": tmp_path / "m.json"}, {"table": tmp_path / "tables" / "ref.parquet"},
                  {"config_id": "c", "seed": 0})
    assert pd.read_parquet(tmp_path / "tables" / "ref.parquet")["fid"].tolist() == [1.25]
