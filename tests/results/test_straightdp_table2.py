"""STRAIGHTDP Table 2 (right): two backbones' Table 1 rows side by side, the signed gain, the tail ratio."""

import json

import pandas as pd
import pytest

from pipeline.reporting.tables import read_table, write_table
from pipeline.results.straightdp_table2 import run_tail_ratio, straightdp_table2_noise_sweep
from pipeline.stage import PipelineError
from pipeline.training.straightdp_runs import StraightRun


def _table(path, accs, fids):
    rows = [{"row": "uniform_moments", "eps_target": eps, "acc_cnn_mean": acc, "acc_cnn_std_seeds": 0.01,
             "fid_mean": fid, "fid_std_seeds": 2.0, "eps_certified": eps * 0.999, "n_seeds": 2}
            for eps, acc, fid in zip((0.3, 1.0), accs, fids)]
    write_table(pd.DataFrame(rows), path, config_id="c", seed=0)
    return path


def _metrics(d, clamp, ratios):
    d.mkdir()
    for (eps, seed), (r0, r1) in ratios.items():
        name = StraightRun("uniform_moments", eps, seed).name
        per = {"0": {"p50": 1.0, "p90": r0, "clip_fraction": 0.1, "p90_over_p50": r0, "steps": 3},
               "1": {"p50": 1.0, "p90": r1, "clip_fraction": 0.1, "p90_over_p50": r1, "steps": 1}}
        (d / f"{name}.json").write_text(json.dumps({"backbone_constraints": {"stream_clamp": clamp},
                                                     "grad_norms_non_private_diagnostic": {"per_bucket": per}}))
    (d / "notes.json").write_text("{}")  # not a run: ignored
    return d


def test_signed_gain_fid_change_and_step_weighted_tail_ratios(tmp_path):
    off = _metrics(tmp_path / "off", None, {(0.3, 0): (2.0, 6.0), (0.3, 1): (2.0, 2.0), (1.0, 0): (1.5, 1.5),
                                            (1.0, 1): (1.5, 1.5)})
    on = _metrics(tmp_path / "on", 16.0, {(0.3, 0): (1.4, 1.4), (0.3, 1): (1.6, 1.6), (1.0, 0): (1.2, 1.2),
                                          (1.0, 1): (1.2, 1.2)})
    out = tmp_path / "t2.parquet"
    straightdp_table2_noise_sweep({"unconstrained": _table(tmp_path / "a.parquet", (0.20, 0.40), (300.0, 250.0)),
                                   "constrained": _table(tmp_path / "b.parquet", (0.25, 0.38), (310.0, 240.0)),
                                   "unconstrained_metrics": off, "constrained_metrics": on},
                                  {"table": out}, {"config_id": "c"})
    t = read_table(out).set_index("eps_target")
    assert t.loc[0.3, "signed_gain_acc_cnn"] == pytest.approx(0.25)  # +25% when noise is large
    assert t.loc[1.0, "signed_gain_acc_cnn"] == pytest.approx(-0.05)  # a cost is reported as a cost
    assert t.loc[0.3, "delta_fid"] == pytest.approx(10.0)
    # seed 0 at eps 0.3: (3 x 2 + 1 x 6) / 4 = 3; seed 1: 2; mean 2.5
    assert t.loc[0.3, "grad_p90_over_p50_unconstrained"] == pytest.approx(2.5)
    assert t.loc[0.3, "grad_p90_over_p50_constrained"] == pytest.approx(1.5)


def test_mismatched_arms_are_one_line_errors(tmp_path):
    off = _metrics(tmp_path / "off", None, {(0.3, 0): (2.0, 2.0)})
    on = _metrics(tmp_path / "on", None, {(0.3, 0): (2.0, 2.0)})
    ins = {"unconstrained": _table(tmp_path / "a.parquet", (0.2, 0.4), (1.0, 1.0)),
           "constrained": _table(tmp_path / "b.parquet", (0.2, 0.4), (1.0, 1.0)),
           "unconstrained_metrics": off, "constrained_metrics": on}
    with pytest.raises(PipelineError, match="constrained_metrics holds runs without the stream clamp"):
        straightdp_table2_noise_sweep(ins, {"table": tmp_path / "t.parquet"}, {})
    with pytest.raises(PipelineError, match="no gradient-norm log"):
        run_tail_ratio({}, "x")


def test_the_ablation_compares_every_arm_with_the_unconstrained_one_at_the_smallest_shared_eps(tmp_path):
    from pipeline.results.straightdp_table2 import straightdp_table2_ablation

    arms = {"unconstrained": _table(tmp_path / "u.parquet", (0.20, 0.40), (300.0, 250.0)),
            "clamp_only": _table(tmp_path / "c.parquet", (0.24, 0.39), (290.0, 240.0)),
            "late_only": _table(tmp_path / "l.parquet", (0.18, 0.41), (310.0, 260.0))}
    out = tmp_path / "abl.parquet"
    straightdp_table2_ablation(arms, {"table": out}, {})
    t = read_table(out).set_index("arm")
    assert list(t.index) == ["unconstrained", "clamp_only", "late_only"] and set(t["eps_target"]) == {0.3}
    assert t.loc["clamp_only", "signed_gain_acc_cnn"] == pytest.approx(0.2)
    assert t.loc["late_only", "signed_gain_acc_cnn"] == pytest.approx(-0.1)  # a cost is reported as a cost
    assert t.loc["unconstrained", "signed_gain_acc_cnn"] == 0
    straightdp_table2_ablation(arms, {"table": out}, {"eps": 1.0})
    assert read_table(out).set_index("arm").loc["clamp_only", "signed_gain_acc_cnn"] == pytest.approx(-0.025)
    with pytest.raises(PipelineError, match="one input must be named unconstrained"):
        straightdp_table2_ablation({"a": arms["clamp_only"]}, {"table": out}, {})
    with pytest.raises(PipelineError, match="eps 3 is not in every arm"):
        straightdp_table2_ablation(arms, {"table": out}, {"eps": 3.0})
