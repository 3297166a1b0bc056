"""Stage straightdp_figure6_toy (STRAIGHTDP Fig. 6): one table row per point, the ledger replays, the figure."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.cli import load_stage
from pipeline.data.embedded import gaussian_mixture_2d
from pipeline.io import save_points
from pipeline.privacy.replay import audit
from pipeline.stage import PipelineError

TOY_DATA = {"n_modes": 4, "radius": 1.0, "std": 0.05}
TINY = {"delta": 1e-5, "dpsgd": {"micro_batch": 64, "proxy_examples": 8, "buckets": 2, "betas": [0, 1],
                                 "noise_multiplicity": 2},
        "horizon": {"n_times": 5, "n_probe": 16}, "sampling": {"steps": 4},
        "toy": {"epsilons": [1.0], "seeds": [0], "hidden": 16, "pretrain_steps": 30, "batch_size": 64,
                "distill_steps": 5, "dpsgd_steps": 3, "dpsgd_batch_size": 40, "n_eval": 40}}


def run(tmp_path, toy_data=TOY_DATA, tiny=TINY):
    points, labels = gaussian_mixture_2d(300, seed=3, **TOY_DATA)
    save_points(tmp_path / "toy.npz", points, labels, name="toy", source="test", seed=3)
    out = {"table": tmp_path / "t.parquet", "figure": tmp_path / "f.png", "ledger": tmp_path / "toy.jsonl"}
    load_stage("straightdp_figure6_toy")({"toy": tmp_path / "toy.npz"}, out,
                                         {"straightdp": tiny, "toy_data": {"n": 300, **toy_data}, "config_id": "c",
                                          "ledger_binding": {"run": "r", "experiment": "exp"}})
    return out


def test_one_row_per_point_every_claim_replays_and_the_figure_is_drawn(tmp_path):
    out = run(tmp_path)
    df = pd.read_parquet(out["table"])
    assert len(df) == 1 + 3  # the public reference + 3 lines (one budget, one seed)
    assert set(df["row"]) == {"public_only", "released_only", "uniform", "tha_moments"}
    private = df[df["row"] != "public_only"]
    assert (private["eps_certified"] <= private["eps_target"]).all() and np.isfinite(private["w2"]).all()
    assert df[df["row"] == "public_only"]["eps_certified"].isna().all()
    claims, summaries = audit({"toy": out["ledger"]}, {"toy": 4})
    assert summaries[0]["ok"] and len(claims) == 4
    assert out["figure"].is_file() and out["figure"].with_suffix(".pdf").is_file()


def test_a_missing_toy_data_key_is_one_line(tmp_path):
    with pytest.raises(PipelineError, match=r"param toy_data.std is required"):
        run(tmp_path, {"n_modes": 4, "radius": 1.0})


def test_a_dpsgd_batch_as_large_as_the_toy_set_is_one_line_naming_both_keys(tmp_path):
    with pytest.raises(PipelineError, match=r"straightdp.toy.dpsgd_batch_size is 300 .* \(data.toy.n\) has 300"):
        run(tmp_path, tiny={**TINY, "toy": {**TINY["toy"], "dpsgd_batch_size": 300}})
