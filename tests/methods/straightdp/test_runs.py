"""STRAIGHTDP runs as values: names round-trip (with and without an arm), the grid, an arm's section."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import validate_config
from pipeline.methods.straightdp import runs as sr
from pipeline.methods.straightdp.runs import StraightRun

arms = st.one_of(st.just(""), st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True))


@given(row=st.sampled_from(sr.ROWS), eps=st.sampled_from([0.1, 0.3, 1.0, 3.0, 10.0, 2.5e-3]),
       seed=st.integers(0, 99), arm=arms)
def test_a_run_name_reads_back_as_the_same_run_and_matches_the_wildcard(row, eps, seed, arm):
    run = StraightRun(row, eps, seed, arm)
    assert StraightRun.from_name(run.name) == run
    assert re.fullmatch(sr.RUN_PATTERN, run.name)
    assert run.main == StraightRun(row, eps, seed) and run.main.name == run.name.split("-")[-1]


def test_main_runs_keep_their_names_and_arm_runs_carry_the_arm_in_front():
    assert StraightRun("uniform", 0.3, 0).name == "uniform_eps0p3_seed0"
    assert StraightRun("tha_moments", 1, 1, "low_b0").name == "low_b0-tha_moments_eps1_seed1"
    for bad in ("Low-uniform_eps1_seed0", "low-b0-uniform_eps1_seed0", "x-uniform_eps1"):
        with pytest.raises(ValueError, match="is not"):
            StraightRun.from_name(bad)
    with pytest.raises(ValueError, match="arm name"):
        StraightRun("uniform", 1, 0, "Bad")


def test_an_arm_runs_its_own_grid_and_reads_the_main_section_with_its_switches_over_it():
    s = validate_config({"straightdp": {"flow": {"num_layers": 3}}})["straightdp"]
    assert [r.name for r in sr.runs(s, "clamp_only")] == ["clamp_only-uniform_moments_eps0p3_seed0",
                                                         "clamp_only-uniform_moments_eps0p3_seed1"]
    section = sr.arm_section(s, "low_b0")
    assert section["flow"]["num_layers"] == 3 and section["flow"]["stream_clamp"] == 16
    assert section["flow"]["late_injection"] == 1 and section["flow"]["decoupled_attention"] is True
    assert section["epsilons"] == [0.3, 1] and "arms" not in section
    assert sr.arm_section(s, "latent")["space"] == "latent" and "space" not in sr.arm_section(s, "")
    assert sr.arm_section(s, "") == {k: v for k, v in s.items() if k != "arms"}
    assert {r.arm for r in sr.arm_runs(s, "table1_main")} == {"latent", "low_b0"}
    assert {r.arm for r in sr.arm_runs(s, "table2_ablation")} == {"low_b0", "clamp_only", "late_only",
                                                                  "decoupled_only"}
    with pytest.raises(ValueError, match="not in straightdp.arms"):
        sr.arm_section(s, "nope")


SGD = {"buckets": 4, "betas": [1, 0, 0.5], "batch_size": 64, "steps": 30, "clip_ref": 2.0}


def test_stage2s_configuration_is_one_uniform_bucket_or_the_tha_buckets_and_shapes():
    # what stage2_plan plans with and the wiring registers: the uniform plan is one bucket of C_ref
    uniform = sr.stage2_config(StraightRun("uniform_moments", 1, 0), SGD, 2500)
    assert (uniform.buckets, uniform.betas, uniform.steps, uniform.clip_ref, uniform.uniform) == (1, (0.0,), 30, 2.0,
                                                                                                  True)
    assert uniform.sampling_rate == 64 / 2500 and uniform.dataset_size == 2500
    shaped = sr.stage2_config(StraightRun("tha", 1, 0), SGD, 2500)
    assert (shaped.buckets, shaped.betas, shaped.uniform) == (4, (0.0, 0.5, 1.0), False)
    assert sr.stage2_config(StraightRun("tha", 1, 0), {**SGD, "betas": [0]}, 2500).uniform  # only the uniform shape
    assert sr.stage2_config(StraightRun("uniform", 1, 0), SGD, 50).sampling_rate == 1.0  # q capped at 1
    with pytest.raises(ValueError, match="released_only trains no flow"):
        sr.stage2_config(StraightRun("released_only", 1, 0), SGD, 2500)


def test_the_toys_points_and_table4s_releases_in_the_order_their_stages_write_them():
    points = sr.toy_points({"seeds": [1, 0], "epsilons": [0.3, 0.1]})
    assert [p.name for p in points[:4]] == ["released_only_eps0p3_seed1", "uniform_eps0p3_seed1",
                                            "tha_moments_eps0p3_seed1", "released_only_eps0p1_seed1"]
    assert len(points) == 12 and points[-1] == StraightRun("tha_moments", 0.1, 0)
    assert sr.table4_releases({"featurisations": ["b", "a"], "epsilons": [1, 3], "seeds": [0, 1]})[:3] == [
        ("b", 1.0, 0), ("b", 1.0, 1), ("b", 3.0, 0)]
    assert sr.toy_sgd({"dpsgd": SGD, "toy": {"dpsgd_steps": 5, "dpsgd_batch_size": 10, "lr": 0.1}}) == {
        **SGD, "steps": 5, "batch_size": 10, "lr": 0.1}
