"""STRAIGHTDP Table 2 from the arms' runs: the noise sweep (signed gain, gradient-norm tail ratio per eps)
and the single-factor ablation, each arm against the main configuration's runs (the unconstrained one)."""

import json

import pytest

from pipeline.reporting.tables import read_table
from pipeline.methods.straightdp.table2 import run_tail_ratio, straightdp_table2
from pipeline.stage import PipelineError
from tests.methods.straightdp.test_table import METRICS, write_run

ROW = "uniform_moments"


def _run(tmp_path, arm, eps, seed, acc, fid, *, clamp=None, ratios=(2.0, 2.0)):
    """One run's inputs (genuine transcripts, its metrics) and its training metrics' gradient-norm log."""
    name = f"{arm + '-' if arm else ''}{ROW}_eps{eps}_seed{seed}"
    inputs = write_run(tmp_path, name, {**METRICS, "acc_cnn": acc, "fid": fid})
    per = {"0": {"p50": 1.0, "p90": ratios[0], "clip_fraction": 0.1, "p90_over_p50": ratios[0], "steps": 3},
           "1": {"p50": 1.0, "p90": ratios[1], "clip_fraction": 0.1, "p90_over_p50": ratios[1], "steps": 1}}
    grad = tmp_path / f"grad_{name}.json"
    grad.write_text(json.dumps({"backbone_constraints": {"stream_clamp": clamp},
                                "grad_norms_non_private_diagnostic": {"per_bucket": per}}))
    return name, {**inputs, f"grad_{name}": grad}


def _arms(tmp_path, spec):
    """spec: (arm, eps, seed) -> (acc, fid, clamp, ratios); returns (run names, inputs) in a fresh folder."""
    tmp_path = tmp_path / str(len(list(tmp_path.iterdir())))
    tmp_path.mkdir()
    names, inputs = [], {}
    for (arm, eps, seed), (acc, fid, clamp, ratios) in spec.items():
        name, ins = _run(tmp_path, arm, eps, seed, acc, fid, clamp=clamp, ratios=ratios)
        names.append(name)
        inputs |= ins
    return names, inputs


SWEEP = {("", 3, 0): (0.18, 290.0, None, (2.0, 6.0)), ("", 3, 1): (0.22, 310.0, None, (2.0, 2.0)),
         ("", 10, 0): (0.40, 250.0, None, (1.5, 1.5)), ("", 10, 1): (0.40, 250.0, None, (1.5, 1.5)),
         ("low_b0", 3, 0): (0.25, 300.0, 16.0, (1.4, 1.4)), ("low_b0", 3, 1): (0.25, 320.0, 16.0, (1.6, 1.6)),
         ("low_b0", 10, 0): (0.38, 240.0, 16.0, (1.2, 1.2)), ("low_b0", 10, 1): (0.38, 240.0, 16.0, (1.2, 1.2))}


def test_the_sweep_reports_the_signed_gain_the_fid_change_and_step_weighted_tail_ratios(tmp_path):
    names, inputs = _arms(tmp_path, SWEEP)
    out = tmp_path / "t2.parquet"
    straightdp_table2(inputs, {"table": out}, {"panel": "noise_sweep", "runs": names, "config_id": "c"})
    t = read_table(out).set_index("eps_target")
    assert set(t["constrained_arm"]) == {"low_b0"} and set(t["row"]) == {ROW}
    assert t.loc[3, "signed_gain_acc_cnn"] == pytest.approx(0.25)  # +25% when noise is large
    assert t.loc[10, "signed_gain_acc_cnn"] == pytest.approx(-0.05)  # a cost is reported as a cost
    assert t.loc[3, "delta_fid"] == pytest.approx(10.0)
    # main seed 0 at eps 3: (3 x 2 + 1 x 6) / 4 = 3; seed 1: 2; mean 2.5
    assert t.loc[3, "grad_p90_over_p50_unconstrained"] == pytest.approx(2.5)
    assert t.loc[3, "grad_p90_over_p50_constrained"] == pytest.approx(1.5)
    # the privacy columns are each arm's certified composition, at or below the target
    assert (t["eps_certified_constrained"] <= t.index).all() and (t["n_seeds_unconstrained"] == 2).all()


def test_sweep_inputs_that_do_not_fit_are_one_line_errors(tmp_path):
    names, inputs = _arms(tmp_path, {**SWEEP, ("low_b0", 3, 1): (0.25, 320.0, None, (1.6, 1.6))})
    out = {"table": tmp_path / "t.parquet"}
    with pytest.raises(PipelineError, match="an arm low_b0 run has no stream clamp"):
        straightdp_table2(inputs, out, {"panel": "noise_sweep", "runs": names})
    names, inputs = _arms(tmp_path, {k: v for k, v in SWEEP.items() if k[0] == "low_b0"})
    with pytest.raises(PipelineError, match="no run of the main configuration"):
        straightdp_table2(inputs, out, {"panel": "noise_sweep", "runs": names})
    names, inputs = _arms(tmp_path, SWEEP)
    with pytest.raises(PipelineError, match="needs --in grad_"):
        straightdp_table2({k: v for k, v in inputs.items() if not k.startswith("grad_low_b0")}, out,
                          {"panel": "noise_sweep", "runs": names})
    with pytest.raises(PipelineError, match="params.panel must be one of noise_sweep, ablation"):
        straightdp_table2(inputs, out, {"panel": "sweep", "runs": names})
    with pytest.raises(PipelineError, match="no gradient-norm log"):
        run_tail_ratio({}, "x")


def test_the_ablation_compares_every_arm_with_the_main_runs_at_the_smallest_shared_eps(tmp_path):
    spec = {("", 3, 0): (0.20, 300.0, None, (2, 2)), ("", 10, 0): (0.40, 250.0, None, (2, 2)),
            ("clamp_only", 3, 0): (0.24, 290.0, 16.0, (2, 2)), ("clamp_only", 10, 0): (0.39, 240.0, 16.0, (2, 2)),
            ("late_only", 3, 0): (0.18, 310.0, None, (2, 2)), ("late_only", 10, 0): (0.41, 260.0, None, (2, 2))}
    names, inputs = _arms(tmp_path, spec)
    out = tmp_path / "abl.parquet"
    straightdp_table2(inputs, {"table": out}, {"panel": "ablation", "runs": names})
    t = read_table(out).set_index("arm")
    assert list(t.index) == ["unconstrained", "clamp_only", "late_only"] and set(t["eps_target"]) == {3}
    assert t.loc["clamp_only", "signed_gain_acc_cnn"] == pytest.approx(0.2)
    assert t.loc["late_only", "signed_gain_acc_cnn"] == pytest.approx(-0.1)  # a cost is reported as a cost
    assert t.loc["unconstrained", "signed_gain_acc_cnn"] == 0
    straightdp_table2(inputs, {"table": out}, {"panel": "ablation", "runs": names, "eps": 10})
    assert read_table(out).set_index("arm").loc["clamp_only", "signed_gain_acc_cnn"] == pytest.approx(-0.025)
    with pytest.raises(PipelineError, match="eps 1 is not in every arm"):
        straightdp_table2(inputs, {"table": out}, {"panel": "ablation", "runs": names, "eps": 1})
