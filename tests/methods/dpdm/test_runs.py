"""DPDM runs as values (pipeline.methods.dpdm.runs): one grammar for a run's name, its inverse,
and the rows of every DPDM table built from the config's dpdm section."""

from __future__ import annotations

import re

import pytest

from pipeline.config import ConfigError, validate_config
from pipeline.methods.dpdm.runs import (
    RUN_PATTERN, DpdmRun, check_sampler_names, main_rows, noise_multiplicity_rows, runs, sampler_rows, table_rows)


def dpdm(**overrides):
    return validate_config({"dpdm": overrides})["dpdm"]


@pytest.mark.parametrize(("run", "name"), [
    (DpdmRun("edm", 0.2, 4, 0), "edm_eps0p2_K4_seed0"),
    (DpdmRun("vpred", 10, 1, 3), "vpred_eps10_K1_seed3"),
    (DpdmRun("ve", 1e-5, 16, 7), "ve_eps1e-05_K16_seed7"),
    (DpdmRun("vp", 3.5, 2, 0), "vp_eps3p5_K2_seed0"),
])
def test_a_run_name_has_no_dots_and_reads_back_to_the_same_run(run, name):
    assert run.name == name and "." not in name
    assert DpdmRun.from_name(name) == run
    assert re.fullmatch(RUN_PATTERN, name)  # the Snakemake wildcard constraint accepts it


@pytest.mark.parametrize("name", ["edm_eps0.2_K4_seed0", "ddpm_eps1_K4_seed0", "edm_eps1_K4", "edm_eps1_K4_seed0.npz"])
def test_a_name_outside_the_grammar_is_refused_by_the_parser_and_the_wildcard(name):
    with pytest.raises(ValueError, match="is not <param>_eps<eps>_K<K>_seed<seed>"):
        DpdmRun.from_name(name)
    assert not re.fullmatch(RUN_PATTERN, name)


def test_an_unknown_parameterisation_is_refused():
    with pytest.raises(ValueError, match="parameterisation must be one of edm, vpred, vp, ve"):
        DpdmRun("ddpm", 1, 4, 0)


def test_main_rows_take_each_epsilons_configuration_and_start_only_edm_from_the_public_denoiser():
    d = dpdm(epsilons=[0.2, 10], seeds=[0, 1], K=4, parameterisation="edm", init="public",
             parameterisation_by_epsilon={"0.2": "vpred"}, sampling={"main": "ddim"})
    rows = main_rows(d)
    assert [r["run"] for r in rows] == ["vpred_eps0p2_K4_seed0", "vpred_eps0p2_K4_seed1",
                                        "edm_eps10_K4_seed0", "edm_eps10_K4_seed1"]
    assert rows[0] == {"row": "vpred_eps0p2_K4_seed0_ddim", "run": "vpred_eps0p2_K4_seed0", "eps_target": 0.2,
                       "parameterisation": "vpred", "K": 4, "sampler": "ddim", "seed": 0,
                       "sampler_chosen_on": "config", "init": "scratch"}
    assert rows[2]["init"] == "public"


def test_ablations_share_runs_with_the_main_table_and_each_run_is_trained_once():
    d = dpdm(epsilons=[1, 10], seeds=[0], K=4, parameterisation_by_epsilon={},
             noise_multiplicity={"epsilon": 10, "K": [1, 4]},
             sampler_ablation={"epsilons": [10], "samplers": ["ddim", "churn"]}, parameterisation_ablation=None)
    assert [r["row"] for r in noise_multiplicity_rows(d)] == ["K1", "K4"]
    assert [r["row"] for r in sampler_rows(d)] == ["ddim_eps10", "churn_eps10"]
    assert set(table_rows(d)) == {"dpdm_table_main", "dpdm_table_noise_multiplicity", "dpdm_table_samplers"}
    # K4 at eps 10 and both sampler rows are the main table's eps-10 run
    assert [r.name for r in runs(d)] == ["edm_eps10_K1_seed0", "edm_eps10_K4_seed0", "edm_eps1_K4_seed0"]


def test_a_sampler_the_tables_use_but_the_config_lacks_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match="config error at dpdm.sampling: no sampler named 'heun'"):
        check_sampler_names(dpdm(sampling={"main": "heun"}))
