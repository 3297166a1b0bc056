"""DPDM's Snakemake wiring (rules/dpdm.smk): run names are target paths, tables pull the runs they need."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.test_workflow import snakemake

# dry runs of the whole DAG through Snakemake: the slow tier (make test-slow)
pytestmark = pytest.mark.slow

TABLES = ["dpdm_table_main", "dpdm_table_noise_multiplicity", "dpdm_table_samplers", "dpdm_table_configurations"]


def _config(tmp_path, **dpdm):
    """The reference run's DPDM (K 2 and four samplers, as configs/digits_full.yaml): the quick tour's K 1 folds the
    K table's K = 1 run into the main runs and its ablation drops a sampler; these counts are the reference DAG's."""
    cfg = tmp_path / "c.yaml"
    ablation = {"epsilons": [0.2, 1, 10], "samplers": ["ddim", "stochastic_ddim", "churn", "guided"]}
    dpdm = {"init": "scratch", "K": 2, "sampler_ablation": ablation, **dpdm}
    cfg.write_text(yaml.safe_dump({"results_dir": str(tmp_path / "results"), "dpdm": dpdm}))
    return str(cfg)


def _jobs(stdout: str) -> dict[str, int]:
    table = stdout.split("Job stats:")[1].split("total")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.mark.parametrize("main,trained,scored", [
    # the main sampler chosen on val: until the checkpoint has run, the tables that use it (and so the
    # K1 and v-prediction runs only they need) are unknown; the ablation's 3 runs x 4 samplers are
    # (in `all`, the ledger replay asks for every run up front)
    ("auto", 3, 12),
    # fixed by hand: eps {0.2, 1, 10} at K=2 (EDM), K=1 at eps 10, v-prediction at eps 0.2;
    # 4 samplers x 3 eps (main sampler included) + K1 + v-prediction = 14 scored sample sets
    ("guided", 5, 14),
])
def test_tables_figures_and_any_run_name_dry_run_with_shared_runs_trained_once(repo, tmp_path, main, trained,
                                                                               scored):
    results = tmp_path / "results"
    targets = [str(results / "tables" / f"{t}.parquet") for t in TABLES]
    targets += [str(results / "figures" / f"dpdm_samples_by_{x}.png") for x in ("epsilon", "sampler")]
    # any run name is a target path too, not only those the tables use
    targets.append(str(results / "digits" / "samples" / "dpdm" / "ve_eps3p5_K16_seed7" / "churn.npz"))
    res = snakemake(repo, "-n", "--cores", "2", *targets, "--configfile", _config(tmp_path, sampling={"main": main}))
    assert res.returncode == 0, res.stderr[-3000:]
    jobs = _jobs(res.stdout)
    assert jobs["train_dpdm"] == trained + 1  # + the extra VE run
    assert jobs["sample_dpdm"] == scored + 1 and jobs["evaluate_dpdm"] == scored
    assert jobs.get("dpdm_select_sampler", 0) == (main == "auto")
    later = ("vpred_eps0p2_K2_seed0", "edm_eps10_K1_seed0") if main != "auto" else ()
    for run in ("edm_eps0p2_K2_seed0", "run=ve_eps3p5_K16_seed7", *later):
        assert run in res.stdout
    for sampler in ("ddim", "stochastic_ddim", "churn", "guided"):  # the sampler ablation covers every eps
        for eps in ("0p2", "1", "10"):
            assert f"edm_eps{eps}_K2_seed0/{sampler}.npz" in res.stdout


def test_auto_main_sampler_without_an_ablation_to_choose_from_is_a_one_line_config_error(repo, tmp_path):
    res = snakemake(repo, "-n", "--cores", "1", "--configfile", _config(tmp_path, sampler_ablation=None))
    assert res.returncode != 0
    assert ("config error at dpdm.sampling.main: 'auto' chooses among dpdm.sampler_ablation.samplers, which is "
            "null") in res.stdout + res.stderr


def test_an_old_single_epsilon_sampler_ablation_is_a_one_line_config_error(repo, tmp_path):
    cfg = _config(tmp_path, sampler_ablation={"epsilon": 10, "samplers": ["ddim"]})
    res = snakemake(repo, "-n", "--cores", "1", "--configfile", cfg)
    assert res.returncode != 0
    expected = "config error at dpdm.sampler_ablation.epsilon: unknown key (did you mean 'epsilons'?)"
    assert expected in res.stdout + res.stderr


def test_an_unknown_main_sampler_is_a_one_line_config_error(repo, tmp_path):
    res = snakemake(repo, "-n", "--cores", "1", "--configfile", _config(tmp_path, sampling={"main": "heun"}))
    assert res.returncode != 0
    assert "config error at dpdm.sampling: no sampler named 'heun'" in res.stdout + res.stderr
