"""STRAIGHTDP result stages: composed certified eps from genuine transcripts, seed aggregation, figures."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger, moments, tha
from pipeline.methods.straightdp import table as sdp
from pipeline.stage import PipelineError

DELTA = 1e-5
#: a coarse PLD grid keeps every recompute well under a second; the lines record it, so the
#: stages certify at it too
COARSE = acc.PLDSettings(value_discretization_interval=1e-3)
RELEASE = moments.MomentReleasePlan(sigma=4.0, R=1.0, N=500, n_classes=10, p=8, delta=DELTA)
THA = tha.THAPlan(edges=tha.bucket_edges(0.35, 3), clips=(0.7, 1.0, 1.3), noise_std=1.5, sampling_rate=0.05,
                  dataset_size=500, steps=30, delta=DELTA, beta=0.5)
UNIFORM = tha.THAPlan(edges=(0.0, 1.0), clips=(1.0,), noise_std=1.5, sampling_rate=0.05, dataset_size=500,
                      steps=30, delta=DELTA)


def write_release(path, plan=RELEASE):
    ledger.append_entry(path, moments.ledger_entry(plan, stage="release_moments", config_id="c", seed=0,
                                                   settings=COARSE))
    return path


def write_train(path, plan=THA):
    ledger.append_entry(path, tha.ledger_entry(plan, stage="train_straightdp", config_id="c", seed=0,
                                               settings=COARSE))
    return path


def independent_eps(*events: dp_event.DpEvent) -> float:
    """dp_accounting's own PLD accountant on the composed event (no pipeline code in between)."""
    accountant = pld_privacy_accountant.PLDAccountant(
        NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=COARSE.value_discretization_interval)
    accountant.compose(dp_event.ComposedDpEvent(list(events)))
    return accountant.get_epsilon(DELTA)


def check_composed(privacy: dict, release_plan, train_plan) -> None:
    """The table's eps is the genuine plans' composition, and more than either part alone."""
    expected = independent_eps(release_plan.event(), train_plan.event())
    assert privacy["eps_certified"] == pytest.approx(expected, rel=1e-3)
    assert privacy["eps_certified"] > max(privacy["eps_release"], privacy["eps_train"]) * 1.01
    assert privacy["eps_certified"] <= privacy["eps_release"] + privacy["eps_train"]


# --------------------------------------------------------------------------- run_privacy

def test_the_certified_eps_is_the_pld_of_the_composition_of_both_lines(tmp_path):
    p = sdp.run_privacy(write_release(tmp_path / "r.jsonl"), write_train(tmp_path / "t.jsonl"))
    check_composed(p, RELEASE, THA)
    assert p["eps_release"] == pytest.approx(independent_eps(RELEASE.event()), rel=1e-3)
    assert p["eps_train"] == pytest.approx(independent_eps(THA.event()), rel=1e-3)
    assert p["delta"] == DELTA and p["K_buckets"] == 3 and p["tau"] == pytest.approx(0.35)
    assert p["dpsgd_steps"] == 30 and p["train_clips"] == [0.7, 1.0, 1.3] and p["beta"] == 0.5
    assert p["release_noise_multiplier"] == 4.0 and p["train_noise_scale"] == 1.5


def test_a_single_stage_run_certifies_that_stage(tmp_path):
    only_release = sdp.run_privacy(write_release(tmp_path / "r.jsonl"), None)
    assert only_release["eps_certified"] == only_release["eps_release"] and math.isnan(only_release["eps_train"])
    only_train = sdp.run_privacy(None, write_train(tmp_path / "u.jsonl", UNIFORM))
    assert only_train["eps_certified"] == pytest.approx(independent_eps(UNIFORM.event()), rel=1e-3)
    assert only_train["K_buckets"] == 1 and only_train["tau"] == 0.0
    with pytest.raises(PipelineError, match="neither"):
        sdp.run_privacy(None, None)


@pytest.mark.parametrize("mutation", ["release_noise_off_in_composition", "release_sensitivity_halved"])
def test_the_composition_check_detects_a_composition_that_spends_less(tmp_path, monkeypatch, mutation):
    """check_composed must fail if the stage dropped the release or halved its sensitivity (doubled sigma)."""
    original = sdp.composed_entry

    def weaker(entries, mechanism):
        release, train = entries
        if mutation == "release_noise_off_in_composition":
            return train  # the release's noise gone from the accounting: as if it cost nothing
        doubled = moments.MomentReleasePlan(sigma=2 * RELEASE.sigma, R=RELEASE.R, N=RELEASE.N,
                                            n_classes=RELEASE.n_classes, p=RELEASE.p, delta=DELTA)
        return original([moments.ledger_entry(doubled, stage="x", config_id="c", seed=0, settings=COARSE), train],
                        mechanism=mechanism)

    monkeypatch.setattr(sdp, "composed_entry", weaker)
    p = sdp.run_privacy(write_release(tmp_path / "r.jsonl"), write_train(tmp_path / "t.jsonl"))
    with pytest.raises(AssertionError):
        check_composed(p, RELEASE, THA)


def _tamper(path, bucket: int):
    """Halve the noise multiplier of ``bucket``'s Gaussian in the stored event (parameters left as they were)."""
    data = json.loads(path.read_text())
    gauss = data["event"]["events"][bucket]["event"]["event"]
    gauss["noise_multiplier"] /= 2
    path.write_text(json.dumps(data) + "\n")


@pytest.mark.parametrize("bucket", [0, 2])
def test_a_line_whose_event_noise_was_halved_is_refused(tmp_path, bucket):
    # bucket 0 carries the line's noise_multiplier (refused when read); bucket 2 only the rebuild sees
    train = write_train(tmp_path / "t.jsonl")
    _tamper(train, bucket)
    with pytest.raises(PipelineError, match="t.jsonl"):
        sdp.run_privacy(write_release(tmp_path / "r.jsonl"), train)


def test_a_wrong_mechanism_or_missing_transcript_names_the_file(tmp_path):
    release = write_release(tmp_path / "r.jsonl")
    with pytest.raises(PipelineError, match=r"r\.jsonl: expected the one tha_dpsgd line"):
        sdp.run_privacy(None, release)
    with pytest.raises(PipelineError, match=r"gone\.jsonl: transcript not found"):
        sdp.run_privacy(tmp_path / "gone.jsonl", None)


def test_lines_at_different_deltas_are_refused(tmp_path):
    other = tha.THAPlan(edges=THA.edges, clips=THA.clips, noise_std=1.5, sampling_rate=0.05, dataset_size=500,
                        steps=30, delta=1e-6)
    with pytest.raises(PipelineError, match="delta"):
        sdp.run_privacy(write_release(tmp_path / "r.jsonl"), write_train(tmp_path / "t.jsonl", other))


# --------------------------------------------------------------------------- tables

def write_run(tmp_path, name: str, metrics: dict) -> dict:
    """The inputs of run ``name``: its metrics JSON and the transcripts its row writes."""
    from pipeline.methods.straightdp.runs import StraightRun

    run = StraightRun.from_name(name)
    out = {f"metrics_{name}": tmp_path / f"metrics_{name}.json"}
    out[f"metrics_{name}"].write_text(json.dumps(metrics))
    if run.releases:
        out[f"release_{name}"] = write_release(tmp_path / f"release_{name}.jsonl")
    if run.trains:
        out[f"train_{name}"] = write_train(tmp_path / f"train_{name}.jsonl", THA if run.plan == "tha" else UNIFORM)
    return out


METRICS = {"fid": 60.0, "acc_logreg": 0.5, "acc_mlp": 0.55, "acc_cnn": 0.7, "label_consistency": 0.4,
           "fid_class_mean": 100.0, "precision": 0.3, "recall": 0.4, "prc_neighborhood": 3, "domain_rate": None}


def two_seeds(tmp_path, row="tha_moments", eps="3"):
    names = [f"{row}_eps{eps}_seed0", f"{row}_eps{eps}_seed1"]
    inputs = {**write_run(tmp_path, names[0], {**METRICS, "acc_cnn": 0.6, "fid": 50.0}),
              **write_run(tmp_path, names[1], {**METRICS, "acc_cnn": 0.8, "fid": 70.0})}
    return names, inputs


def test_table1_aggregates_two_seeds_with_the_composed_certified_eps(tmp_path):
    names, inputs = two_seeds(tmp_path)
    u_name = "uniform_eps3_seed0"
    inputs.update(write_run(tmp_path, u_name, METRICS))
    out = tmp_path / "t1.parquet"
    sdp.straightdp_table(inputs, {"table": out}, {"table": "table1_main", "runs": [*names, u_name],
                                                  "epsilons": [3], "config_id": "cfg"})
    df = pd.read_parquet(out)
    assert df["row"].tolist() == ["uniform", "tha_moments"]  # the paper's row order
    tm = df.iloc[1]
    assert tm["label"] == "THA + moments" and tm["n_seeds"] == 2 and tm["seeds"] == "0,1"
    assert tm["acc_cnn_mean"] == pytest.approx(0.7) and tm["acc_cnn_std_seeds"] == pytest.approx(0.1 * math.sqrt(2))
    assert tm["fid_mean"] == pytest.approx(60.0) and tm["acc_logreg_std_seeds"] == 0.0
    assert tm["eps_certified"] == pytest.approx(independent_eps(RELEASE.event(), THA.event()), rel=1e-3)
    assert tm["eps_certified"] > max(tm["eps_release"], tm["eps_train"])
    assert df.iloc[0]["n_seeds"] == 1 and math.isnan(df.iloc[0]["acc_cnn_std_seeds"])
    # each row certifies its own events (the memo of certified eps keys on the event)
    assert df.iloc[0]["eps_certified"] == pytest.approx(independent_eps(UNIFORM.event()), rel=1e-3)
    assert math.isnan(df.iloc[0]["eps_release"]) and (df["eps_certified"] <= df["eps_target"]).all()
    assert set(df["config_id"]) == {"cfg"} and "domain_rate_mean" not in df.columns
    assert "seed" not in df.columns  # a row is a mean over the seeds it names, not one seed's


def test_a_table_of_one_seed_per_row_prints_no_spread_column_and_no_single_seed(tmp_path):
    inputs = {**write_run(tmp_path, "uniform_eps3_seed0", METRICS), **write_run(tmp_path, "tha_moments_eps3_seed0",
                                                                                METRICS)}
    out = tmp_path / "t1.parquet"
    sdp.straightdp_table(inputs, {"table": out}, {"table": "table1_main", "epsilons": [3], "config_id": "cfg",
                                                  "runs": ["uniform_eps3_seed0", "tha_moments_eps3_seed0"]})
    df = pd.read_parquet(out)
    assert not [c for c in df.columns if c.endswith("_std_seeds")] and (df["n_seeds"] == 1).all()
    assert "seed" not in df.columns and df["seeds"].tolist() == ["0", "0"]
    # all-NaN only where nothing was measured: no release on the uniform row, no CLIP or domain metric in METRICS
    assert {c for c in df.columns if df[c].isna().all()} <= {"eps_release", "domain_rate_mean", "clip_fd_mean",
                                                              "clip_zero_shot_acc_mean"}


def test_a_figures_title_says_what_its_bands_are_and_one_seed_draws_none():
    assert sdp.band_note(1, 1) == "one seed: no band"
    assert sdp.band_note(3, 3) == "bands ±1 std over 3 seeds"
    assert sdp.band_note(1, 3) == "bands ±1 std over 2-3 seeds; one-seed points have none"


def test_table1_lists_an_arms_rows_after_the_main_ones_labelled_with_the_arm(tmp_path):
    names, inputs = two_seeds(tmp_path, row="uniform")
    arm = ["latent-uniform_eps3_seed0", "latent-uniform_eps3_seed1"]
    inputs.update(write_run(tmp_path, arm[0], {**METRICS, "acc_cnn": 0.1}))
    inputs.update(write_run(tmp_path, arm[1], {**METRICS, "acc_cnn": 0.3}))
    out = tmp_path / "t1.parquet"
    sdp.straightdp_table(inputs, {"table": out}, {"table": "table1_main", "runs": [*arm, *names], "config_id": "c"})
    df = pd.read_parquet(out)
    assert df["arm"].tolist() == ["main", "latent"] and df["row"].tolist() == ["uniform", "uniform"]
    assert df["label"].tolist() == ["Uniform DP-SGD", "Uniform DP-SGD [latent]"]
    assert df["acc_cnn_mean"].tolist() == pytest.approx([0.7, 0.2]) and (df["n_seeds"] == 2).all()


@pytest.mark.parametrize("table, columns", [
    ("table5_per_class", ["fid_class_mean_mean", "label_consistency_mean", "domain_rate_mean"]),
    ("table6_fid_vs_eps", ["fid_mean", "fid_std_seeds"]),
    ("table7_precision_recall", ["precision_mean", "recall_mean", "prc_neighborhood"]),
])
def test_each_table_carries_its_metrics(tmp_path, table, columns):
    names, inputs = two_seeds(tmp_path, row="released_only")
    sdp.straightdp_table(inputs, {"table": tmp_path / "t.parquet"}, {"table": table, "runs": names,
                                                                    "config_id": "c"})
    df = pd.read_parquet(tmp_path / "t.parquet")
    assert set(columns) <= set(df.columns) and len(df) == 1
    if table == "table5_per_class":
        assert math.isnan(df["domain_rate_mean"].iloc[0])  # null in the metrics: NaN, never invented


def test_table5_averages_the_domain_rate_of_evaluate_samples(tmp_path):
    names = ["released_only_eps3_seed0", "released_only_eps3_seed1"]
    inputs = {**write_run(tmp_path, names[0], {**METRICS, "domain_rate": 0.2}),
              **write_run(tmp_path, names[1], {**METRICS, "domain_rate": 0.4})}
    sdp.straightdp_table(inputs, {"table": tmp_path / "t.parquet"}, {"table": "table5_per_class", "runs": names,
                                                                    "epsilons": [3], "config_id": "c"})
    row = pd.read_parquet(tmp_path / "t.parquet").iloc[0]
    assert row["domain_rate_mean"] == pytest.approx(0.3) and row["eps_certified"] <= 3


def test_a_row_whose_certified_eps_exceeds_its_target_is_refused(tmp_path):
    names, inputs = two_seeds(tmp_path, eps="1")  # the transcripts certify ~1.8 > 1
    with pytest.raises(PipelineError, match=r"tha_moments_eps1_seed\d certifies eps .* > its target 1"):
        sdp.straightdp_table(inputs, {"table": tmp_path / "t.parquet"},
                             {"table": "table6_fid_vs_eps", "runs": names, "config_id": "c"})
    assert not (tmp_path / "t.parquet").exists()


def test_the_eps_check_fails_if_the_certified_eps_were_understated(tmp_path, monkeypatch):
    """The target check itself: with eps halved inside the stage the same transcripts pass, so the
    refusal above is due to the certified composition, not to something else."""
    names, inputs = two_seeds(tmp_path, eps="1")
    real = sdp.run_privacy

    def understated(release, train):
        p = real(release, train)
        return {**p, "eps_certified": p["eps_certified"] / 2}

    monkeypatch.setattr(sdp, "run_privacy", understated)
    sdp.straightdp_table(inputs, {"table": tmp_path / "t.parquet"},
                         {"table": "table6_fid_vs_eps", "runs": names, "config_id": "c"})


def test_bad_params_and_missing_inputs_are_one_line_errors(tmp_path):
    names, inputs = two_seeds(tmp_path)
    out = {"table": tmp_path / "t.parquet"}
    with pytest.raises(PipelineError, match="params.table must be one of"):
        sdp.straightdp_table(inputs, out, {"table": "table9", "runs": names, "config_id": "c"})
    with pytest.raises(PipelineError, match=r"needs --in train_tha_moments_eps3_seed1=PATH"):
        sdp.straightdp_table({k: v for k, v in inputs.items() if k != f"train_{names[1]}"}, out,
                             {"table": "table1_main", "runs": names, "config_id": "c"})
    with pytest.raises(PipelineError, match=r"not one of params.epsilons"):
        sdp.straightdp_table(inputs, out, {"table": "table1_main", "runs": names, "epsilons": [1], "config_id": "c"})
    with pytest.raises(PipelineError, match=r"no run at eps \[10.0\]"):
        sdp.straightdp_table(inputs, out, {"table": "table1_main", "runs": names, "epsilons": [3, 10],
                                           "config_id": "c"})


# --------------------------------------------------------------------------- figures

def test_the_accuracy_figure_is_written(tmp_path):
    names, inputs = two_seeds(tmp_path)
    inputs.update(write_run(tmp_path, "uniform_eps1_seed0", METRICS))
    png = tmp_path / "fig3.png"
    sdp.straightdp_figure_accuracy(inputs, {"figure": png}, {"runs": [*names, "uniform_eps1_seed0"]})
    assert png.stat().st_size > 1000 and png.with_suffix(".pdf").stat().st_size > 1000


def test_the_horizon_figure_is_written_and_a_bad_horizon_refused(tmp_path):
    ts = [i / 20 for i in range(21)]
    horizon = {"ts": ts, "conditional_worst": [1 - t for t in ts], "unconditional": [1 - t / 2 for t in ts],
               "conditional_per_class": [[1 - t] * 3 for t in ts], "tau": 0.1, "threshold": 0.9, "tau_max": 0.35}
    (tmp_path / "h.json").write_text(json.dumps(horizon))
    png = tmp_path / "fig2a.png"
    sdp.straightdp_figure_horizon({"horizon": tmp_path / "h.json"}, {"figure": png}, {})
    assert png.stat().st_size > 1000 and png.with_suffix(".pdf").is_file()
    (tmp_path / "bad.json").write_text(json.dumps({**horizon, "unconditional": [1.0]}))
    with pytest.raises(PipelineError, match="equal-length"):
        sdp.straightdp_figure_horizon({"horizon": tmp_path / "bad.json"}, {"figure": png}, {})


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=4), st.floats(0.1, 10))
def test_aggregate_is_the_mean_and_sample_std_over_seeds_and_keeps_the_largest_eps(values, target):
    eps = [target * (0.5 + 0.1 * i) for i in range(len(values))]
    records = pd.DataFrame([{"run": f"uniform_eps1_seed{i}", "arm": "main", "row": "uniform",
                             "label": "Uniform DP-SGD", "eps_target": target, "seed_run": i,
                             "eps_certified": e, "eps_release": math.nan, "eps_train": e, "delta": DELTA,
                             "metrics": {"acc_cnn": v}} for i, (v, e) in enumerate(zip(values, eps))])
    row = sdp.aggregate(records, metrics=("acc_cnn",), epsilons=[target]).iloc[0]
    assert row["acc_cnn_mean"] == pytest.approx(sum(values) / len(values))
    if len(values) > 1:
        assert row["acc_cnn_std_seeds"] == pytest.approx(pd.Series(values).std(ddof=1), abs=1e-12)
    assert row["eps_certified"] == max(eps) and row["n_seeds"] == len(values)
    over = records.assign(eps_certified=records["eps_certified"].where(records["seed_run"] != 0, target * 1.01))
    with pytest.raises(PipelineError, match="seed0 certifies eps"):
        sdp.aggregate(over, metrics=("acc_cnn",), epsilons=[target])
