"""DPDM's wiring (pipeline/methods/dpdm/wiring.py): a run's files and params, the main sampler chosen on val, the
tables' rows and inputs, the sample grids, targets per ablation switch, transcripts and all_runs records."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.config import ConfigError, config_id
from pipeline.methods.dpdm import costs
from pipeline.methods.dpdm.wiring import (CLASSIFIER_TABLE, MAIN_TABLE, SAMPLER_TABLE, TRAIN_KEYS, VARIANCE_FIGURE,
                                          Wiring)
from pipeline.registry import TranscriptSpec
from pipeline.methods.dpdm import runs as dpdm_runs
from tests.methods import check_requests
from tests.methods import house as tour_house


def house(tmp_path: Path, edit=None):
    """config.yaml with a sampler ablation over three epsilons and three samplers (the quick tour's before issue #40;
    today's is eps 1 and two samplers): the grid these specifications are written against; then ``edit``."""
    def grid(cfg):
        cfg["dpdm"]["sampler_ablation"] = {"epsilons": [0.2, 1, 10], "samplers": ["ddim", "churn", "guided"]}
        if edit:
            edit(cfg)
    return tour_house(tmp_path, grid)


def chosen(tmp_path: Path, sampler: str):
    """A selection file as checkpoint dpdm_select_sampler writes it, and the callable that finds it."""
    path = tmp_path / "selection.json"
    path.write_text(json.dumps({"sampler": sampler}))
    return lambda: str(path)


def fixed_main(sampler: str):
    def edit(cfg):
        cfg["dpdm"]["sampling"]["main"] = sampler
    return edit


@pytest.fixture
def w(tmp_path) -> Wiring:
    return Wiring(house(tmp_path), selection=chosen(tmp_path, "churn"))


@pytest.fixture
def exp(tmp_path) -> Path:
    return tmp_path / "r" / "digits"


def wc(run: str, sampler: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(run=run, sampler=sampler)


# ---------------------------------------------------------------------------------------------- files


def test_a_runs_files_sit_under_the_experiment_by_kind(w, exp, tmp_path):
    run = "edm_eps1_K1_seed0"
    assert w.model_path(run) == exp / "models" / "dpdm" / f"{run}.pt"
    assert w.ledger_path(run) == exp / "ledger" / f"train_dpdm_{run}.jsonl"
    assert w.train_metrics(run) == exp / "train" / "dpdm" / f"{run}.json"
    assert w.samples_path(run, "churn") == exp / "samples" / "dpdm" / run / "churn.npz"
    assert w.samples_manifest(run, "churn") == exp / "samples" / "dpdm" / run / "churn.json"
    assert w.metrics_path(run, "churn") == exp / "eval" / "dpdm" / run / "churn" / "metrics.json"
    assert w.selection == exp / "dpdm" / "sampler_selection.json"
    assert w.table_path(MAIN_TABLE) == tmp_path / "r" / "tables" / "dpdm_table_main.parquet"
    assert w.figure_path("dpdm_samples_by_epsilon", ".pdf") == tmp_path / "r" / "figures" / "dpdm_samples_by_epsilon.pdf"
    # rule wildcards format into the same paths
    assert w.samples_path("{run}", "{sampler}") == exp / "samples" / "dpdm" / "{run}" / "{sampler}.npz"


# ---------------------------------------------------------------------------------------------- runs and rows


def test_the_runs_are_every_table_rows_run_once(w):
    """The quick tour: eps 0.2 / 1 / 10 main runs (K 1), the K table's K 2 run at eps 10, v-prediction at eps 0.2."""
    assert [r.name for r in w.runs()] == ["edm_eps0p2_K1_seed0", "edm_eps10_K1_seed0", "edm_eps10_K2_seed0",
                                          "edm_eps1_K1_seed0", "vpred_eps0p2_K1_seed0"]
    assert w.section is w.house.config["dpdm"]


def test_under_auto_the_main_tables_read_the_sampler_val_chose_and_the_ablation_never_waits(tmp_path):
    asked = []

    def selection():
        asked.append(1)
        return chosen(tmp_path, "guided")()

    w = Wiring(house(tmp_path), selection=selection)
    ablation = w.rows(SAMPLER_TABLE)
    assert asked == [] and {r["sampler"] for r in ablation} == {"ddim", "churn", "guided"}
    main = w.rows(MAIN_TABLE)
    assert asked and {r["sampler"] for r in main} == {"guided"}
    assert {r["sampler_chosen_on"] for r in main} == {"val"}
    assert w.main_sampler() == "guided"


def test_a_fixed_main_sampler_never_asks_for_the_checkpoint(tmp_path):
    w = Wiring(house(tmp_path, fixed_main("ddim")))  # no selection at all
    assert w.main_sampler() == "ddim"
    assert {r["sampler_chosen_on"] for r in w.rows(MAIN_TABLE)} == {"config"}


def test_auto_without_the_checkpoint_is_a_programming_error_not_a_silent_default(tmp_path):
    with pytest.raises(RuntimeError, match="auto"):
        Wiring(house(tmp_path)).main_sampler()


def test_a_sampler_the_tables_use_but_the_config_lacks_is_one_config_error(tmp_path):
    def missing(cfg):
        cfg["dpdm"]["sampler_ablation"]["samplers"] = ["ddim", "heun"]
    with pytest.raises(ConfigError, match="heun"):
        Wiring(house(tmp_path, missing)).check_sampler_names()
    Wiring(house(tmp_path)).check_sampler_names()
    assert Wiring(house(tmp_path)).sampler_settings("ddim") == {"name": "ddim", "steps": 20}


# ---------------------------------------------------------------------------------------------- targets


def test_the_targets_are_the_main_table_and_grid_and_each_ablation_switched_on(w, tmp_path):
    tables, figures = tmp_path / "r" / "tables", tmp_path / "r" / "figures"
    assert w.targets() == [tables / "dpdm_table_main.parquet", figures / "dpdm_samples_by_epsilon.png",
                           tables / "dpdm_table_noise_multiplicity.parquet", tables / "dpdm_table_samplers.parquet",
                           figures / "dpdm_samples_by_sampler.png", tables / "dpdm_table_configurations.parquet",
                           tables / "dpdm_table_dpsgd_classifier.parquet",
                           tables / "dpdm_figure3_gradient_variance.parquet",
                           figures / "dpdm_figure3_gradient_variance.png"]

    def no_ablations(cfg):
        cfg["dpdm"].update(noise_multiplicity=None, sampler_ablation=None, parameterisation_ablation=None,
                           dpsgd_classifier=None, gradient_variance=None,
                           sampling={**cfg["dpdm"]["sampling"], "main": "ddim"})
    bare = Wiring(house(tmp_path, no_ablations))
    assert bare.targets() == [tables / "dpdm_table_main.parquet", figures / "dpdm_samples_by_epsilon.png"]
    assert [r.name for r in bare.runs()] == ["edm_eps0p2_K1_seed0", "edm_eps10_K1_seed0", "edm_eps1_K1_seed0"]


# ---------------------------------------------------------------------------------------------- transcripts and records


def test_every_training_run_has_one_transcript_bound_to_its_run_and_the_private_split(w, exp):
    specs = w.transcripts()
    assert list(specs) == [*(w.ledger_path(r.name) for r in w.runs()),
                           *(w.classifier_ledger_path(r.name) for r in w.classifier_runs())]
    # held to the DP-SGD the configuration ran: the declared N, the batch, T = ceil(epochs N / batch), the clip; sigma
    # to the run's eps
    d = w.section
    steps = -(-d["epochs"] * 2500 // d["batch_size"])
    assert specs[w.ledger_path("edm_eps1_K1_seed0")] == TranscriptSpec(
        claims=1, run="edm_eps1_K1_seed0", stage="train_dpdm", delta=1e-5, data=exp / "data" / "private_train.npz",
        params={"sampling.scheme": "poisson", "sampling.n": 2500, "extra.expected_batch_size": d["batch_size"],
                "count": steps, "extra.max_grad_norm": d["clip"]}, epsilon_target=1.0)


def test_every_evaluated_run_and_sampler_is_an_all_runs_record_and_only_the_main_table_is_the_figures_line(w, exp):
    records = [r for r in w.records() if r.method == "dpdm"]
    main = [r for r in records if r.in_figure]
    assert [r.config for r in main] == ["edm_eps0p2_K1_seed0/churn", "edm_eps1_K1_seed0/churn",
                                        "edm_eps10_K1_seed0/churn"]
    assert {r.label for r in main} == {"DPDM"} and {r.label for r in records if not r.in_figure} == {"DPDM (ablations)"}
    assert [r for r in records if r.headline] == main  # an ablation never heads the summary
    # the K table (2) + the sampler ablation (3 x 3) + the configurations (EDM, v-prediction) beside the main table's 3
    assert len(records) == 3 + 2 + 9 + 2
    r = main[1]
    assert (r.method, r.seed, r.epsilon_target) == ("dpdm", 0, 1)
    assert r.metrics == str(w.metrics_path("edm_eps1_K1_seed0", "churn"))
    assert r.ledgers == (str(w.ledger_path("edm_eps1_K1_seed0")),)
    bench = exp / "benchmarks"
    assert r.benchmarks == tuple(str(p) for p in (bench / "train_dpdm" / "edm_eps1_K1_seed0.tsv",
                                                  bench / "sample_dpdm" / "edm_eps1_K1_seed0" / "churn.tsv",
                                                  bench / "evaluate_dpdm" / "edm_eps1_K1_seed0" / "churn.tsv"))


# ---------------------------------------------------------------------------------------------- jobs


def test_a_training_run_reads_the_private_split_and_the_public_denoiser_it_starts_from(w, exp, tmp_path):
    assert w.init_of("edm") == "public"
    assert w.train_inputs(wc("edm_eps1_K1_seed0")) == {"data": exp / "data" / "private_train.npz",
                                                       "init": exp / "models" / "public_edm.pt"}

    def scratch(cfg):
        cfg["dpdm"]["init"] = "scratch"
    assert Wiring(house(tmp_path, scratch)).train_inputs(wc("edm_eps1_K1_seed0")) == {
        "data": exp / "data" / "private_train.npz"}


def test_a_training_runs_params_come_from_its_name_the_section_and_the_declared_private_constants(w):
    p = json.loads(w.train_params(wc("vpred_eps0p2_K1_seed0")))
    assert (p["parameterisation"], p["epsilon"], p["K"], p["seed"]) == ("vpred", 0.2, 1, 0)
    assert {k: p[k] for k in TRAIN_KEYS} == {k: w.section[k] for k in TRAIN_KEYS}
    assert p["private"] == {"N": 2500, "n_classes": 10}  # public constants, never len(split)
    assert p["ledger_binding"] == {"run": "vpred_eps0p2_K1_seed0", "experiment": "digits"}
    settings = {k: v for k, v in p.items() if k not in ("config_id", "device", "threads", "checkpoint_every_s",
                                                         "ledger_binding")}
    assert p["config_id"] == config_id(settings)
    # another run of the same section differs only where its name does
    q = json.loads(w.train_params(wc("vpred_eps1_K3_seed2")))
    assert {k for k in p if p[k] != q[k]} == {"epsilon", "K", "seed", "ledger_binding", "config_id"}


def test_trainable_is_passed_only_to_a_run_that_starts_from_the_public_weights(tmp_path):
    def partial(cfg):
        cfg["dpdm"]["trainable"] = ["*attentions*"]
        cfg["dpdm"]["parameterisation_ablation"] = {"epsilon": 0.2, "parameterisations": ["vp"]}
    w = Wiring(house(tmp_path, partial))
    assert w.init_of("edm") == "public" and w.init_of("vp") == "scratch"
    assert json.loads(w.train_params(wc("edm_eps1_K1_seed0")))["trainable"] == ["*attentions*"]
    assert json.loads(w.train_params(wc("vp_eps0p2_K1_seed0")))["trainable"] is None


def test_a_sample_job_names_its_sampler_settings_and_generates_with_the_runs_seed(w):
    p = json.loads(w.sample_params(wc("edm_eps1_K1_seed3", "churn")))
    assert p["sampler"] == w.section["sampling"]["samplers"]["churn"]
    assert (p["seed"], p["n_samples"], p["name"]) == (3, 250, "dpdm/edm_eps1_K1_seed3/churn")
    e = json.loads(w.evaluate_params(wc("edm_eps1_K1_seed3", "churn")))
    assert e["name"] == "dpdm/edm_eps1_K1_seed3/churn" and e["evaluation"] == w.evaluation.params()
    with pytest.raises(ConfigError, match="heun"):
        w.sample_params(wc("edm_eps1_K1_seed3", "heun"))


def test_every_rule_asks_for_its_request_in_dpdm_s_cost_model(w):
    requests = check_requests(w, "dpdm.smk", costs.REQUESTS)
    cfg = w.house.config
    assert w.train_runtime_min == costs.train_runtime_min(cfg) > 0  # the training rule's retries
    sample = requests["sample_dpdm"]
    assert (sample["gpu"], sample["mem_mb"], sample["runtime"]) == (1, 4000, costs.sample_runtime_min(cfg))
    assert sample["gpu_mem_mb"](None) == costs.sample_memory(cfg).predicted_mb
    train = requests["train_dpdm"]
    assert (train["gpu"], train["tasks"], train["mem_mb"]) == (1, 1, costs.train_mem_mb(cfg))
    # the GPU memory of a run: its own K from its name (the K ablation's K = 1 run holds fewer draws than K = 4)
    one, four = (train["gpu_mem_mb"](SimpleNamespace(run=f"edm_eps10_K{k}_seed0")) for k in (1, 4))
    assert one < four == costs.train_gpu_mem_mb(cfg, 4)
    # and its runtime at its own K, from the run name
    assert train["runtime"](SimpleNamespace(run="edm_eps10_K4_seed0")) == costs.train_runtime_min(cfg, 4)


def test_dpdm_gpus_sets_a_training_jobs_processes_cores_and_memory_but_not_its_params(w, tmp_path):
    assert (w.train_gpus, w.train_threads) == (1, w.house.torch_threads)
    four = Wiring(house(tmp_path, lambda cfg: cfg["dpdm"].update(gpus=4)))
    mem = (four.resources("train_dpdm")["mem_mb"], w.resources("train_dpdm")["mem_mb"])
    assert (four.train_gpus, four.train_threads, mem[0]) == (4, 4 * w.train_threads, 4 * mem[1])
    assert four.resources("train_dpdm")["gpu"] == 4
    # the same mechanism, sample and noise on any number of processes: no rerun, no new config id
    assert four.train_params(wc("edm_eps1_K1_seed0")) == w.train_params(wc("edm_eps1_K1_seed0"))


# ---------------------------------------------------------------------------------------------- tables, choice, grids


def test_a_tables_inputs_are_each_rows_metrics_and_its_runs_ledger(w):
    ins = w.table_inputs("dpdm_table_noise_multiplicity")
    assert ins == {"metrics_K1": w.metrics_path("edm_eps10_K1_seed0", "churn"),
                   "ledger_K1": w.ledger_path("edm_eps10_K1_seed0"),
                   "metrics_K2": w.metrics_path("edm_eps10_K2_seed0", "churn"),
                   "ledger_K2": w.ledger_path("edm_eps10_K2_seed0")}
    p = json.loads(w.table_params("dpdm_table_noise_multiplicity"))
    assert p["rows"] == w.rows("dpdm_table_noise_multiplicity") and p["seed"] == 0


def test_the_choice_of_sampler_reads_the_ablations_metrics_and_nothing_else(w):
    ins = w.selection_inputs()
    assert len(ins) == 9 and ins["metrics_guided_eps10"] == w.metrics_path("edm_eps10_K1_seed0", "guided")
    assert json.loads(w.selection_params())["rows"] == w.rows(SAMPLER_TABLE)


def test_the_sample_grids_show_the_main_sampler_per_eps_and_every_sampler_at_the_largest_eps(w):
    assert w.grid_inputs() == {"eps_0p2": w.samples_path("edm_eps0p2_K1_seed0", "churn"),
                               "eps_1": w.samples_path("edm_eps1_K1_seed0", "churn"),
                               "eps_10": w.samples_path("edm_eps10_K1_seed0", "churn")}
    g = json.loads(w.grid_params())
    assert g["titles"] == {"eps_0p2": "eps = 0.2", "eps_1": "eps = 1", "eps_10": "eps = 10"}
    assert g["title"] == "DPDM samples (auto) by target eps" and g["per_class"] == 8
    assert w.sampler_grid_eps == 10
    assert w.sampler_grid_inputs() == {s: w.samples_path("edm_eps10_K1_seed0", s) for s in ("ddim", "churn", "guided")}
    assert json.loads(w.sampler_grid_params())["title"] == "DPDM samplers at eps = 10"


# ---------------------------------------------------------------------------------------------- bundles

def test_every_training_run_has_a_bundle_of_its_weights_sampled_as_the_main_sampler_samples(w, exp):
    assert w.bundle_runs() == [r.name for r in w.runs()]
    b = w.bundle("edm_eps1_K1_seed0")
    assert b.kind == "model" and b.model == str(exp / "models" / "dpdm" / "edm_eps1_K1_seed0.pt")
    assert b.samples == str(w.samples_path("edm_eps1_K1_seed0", "churn"))  # the sampler val chose
    assert b.metrics == str(w.metrics_path("edm_eps1_K1_seed0", "churn"))
    assert b.transcripts == (str(w.ledger_path("edm_eps1_K1_seed0")),) and b.epsilon_target == 1.0
    s = w.section["sampling"]
    assert b.sampling == {"sampler": "dpdm", "sampler_name": "churn", "settings": w.sampler_settings("churn"),
                          "seed": 0, "batch_size": s["batch_size"], "n_samples": s["n_samples"],
                          "threads": w.house.torch_threads}
    # a run that starts from the public denoiser says its pretraining is outside the eps; one from scratch does not
    assert any("public pretraining" in c for c in b.not_covered)
    assert not any("public pretraining" in c for c in w.bundle("vpred_eps0p2_K1_seed0").not_covered)


# ---------------------------------------------------------------------------------------------- the DP-SGD classifier


def test_the_classifier_runs_are_each_classifier_at_dpdms_epsilons_and_seeds(w, exp):
    assert [r.name for r in w.classifier_runs()] == ["cnn_eps0p2_seed0", "cnn_eps1_seed0", "cnn_eps10_seed0"]
    run = "cnn_eps1_seed0"
    assert w.classifier_model_path(run) == exp / "models" / "dpsgd_classifier" / f"{run}.pt"
    assert w.classifier_ledger_path(run) == exp / "ledger" / f"train_dpsgd_classifier_{run}.jsonl"
    assert w.classifier_metrics_path(run) == exp / "eval" / "dpsgd_classifier" / run / "metrics.json"
    # the private split through DP-SGD only; test and val score the release
    assert w.classifier_inputs == {"data": exp / "data" / "private_train.npz", "test": exp / "data" / "test.npz",
                                   "val": exp / "data" / "val.npz"}
    both = Wiring(house(exp.parent.parent, lambda cfg: cfg["dpdm"].update(
        dpsgd_classifier={"classifiers": ["cnn", "logreg"]}, seeds=[0, 1])))
    assert len(both.classifier_runs()) == 2 * 3 * 2 and both.classifier_runs()[-1].name == "logreg_eps10_seed1"


def test_a_classifier_runs_params_are_its_name_dpdms_delta_the_section_and_the_downstream_cnn(w):
    p = json.loads(w.classifier_params(wc("cnn_eps0p2_seed0")))
    section = w.section["dpsgd_classifier"] or {}
    assert (p["classifier"], p["epsilon"], p["seed"], p["delta"]) == ("cnn", 0.2, 0, w.section["delta"])
    assert (p["batch_size"], p["epochs"], p["lr"], p["clip"]) == (section.get("batch_size", 250),
                                                                   section.get("epochs", 5),
                                                                   section.get("lr", 0.02), section.get("clip", 1.0))
    evalnet = w.house.config["evaluation"]["evalnet"]
    assert (p["width"], p["feature_dim"]) == (evalnet["width"], evalnet["feature_dim"])
    assert p["private"] == {"N": 2500, "n_classes": 10} and "classifiers" not in p
    assert p["ledger_binding"] == {"run": "cnn_eps0p2_seed0", "experiment": "digits"}
    q = json.loads(w.classifier_params(wc("cnn_eps10_seed0")))
    assert {k for k in p if p[k] != q[k]} == {"epsilon", "ledger_binding", "config_id"}
    assert w.resources("train_dpsgd_classifier")["runtime"] >= 10


def test_each_classifier_run_has_its_transcript_and_an_all_runs_record_of_its_own_method(w, exp):
    spec = w.transcripts()[w.classifier_ledger_path("cnn_eps1_seed0")]
    c = dpdm_runs.subsection(w.section, "dpsgd_classifier")
    assert spec == TranscriptSpec(claims=1, run="cnn_eps1_seed0", stage="train_dpsgd_classifier", delta=1e-5,
                                  data=exp / "data" / "private_train.npz", epsilon_target=1.0,
                                  params={"sampling.scheme": "poisson", "sampling.n": 2500,
                                          "extra.expected_batch_size": c["batch_size"],
                                          "count": -(-c["epochs"] * 2500 // c["batch_size"]),
                                          "extra.max_grad_norm": c["clip"]})
    records = w.classifier_records()
    assert records == [r for r in w.records() if r.method == "dpsgd_classifier"] and len(records) == 3
    r = records[1]
    assert (r.config, r.seed, r.epsilon_target, r.private) == ("cnn_eps1_seed0", 0, 1.0, True)
    assert r.metrics == str(w.classifier_metrics_path("cnn_eps1_seed0"))
    assert r.ledgers == (str(w.classifier_ledger_path("cnn_eps1_seed0")),)
    assert r.benchmarks == (str(exp / "benchmarks" / "train_dpsgd_classifier" / "cnn_eps1_seed0.tsv"),)
    assert r.in_figure and r.headline and "DP-SGD CNN" in r.label


def test_the_classifier_table_reads_every_run_and_dpdms_main_table(w):
    assert CLASSIFIER_TABLE == "dpdm_table_dpsgd_classifier"
    ins = w.classifier_table_inputs()
    assert ins["dpdm_main"] == w.table_path(MAIN_TABLE) and len(ins) == 1 + 2 * 3
    assert ins["metrics_cnn_eps1_seed0"] == w.classifier_metrics_path("cnn_eps1_seed0")
    assert ins["ledger_cnn_eps1_seed0"] == w.classifier_ledger_path("cnn_eps1_seed0")
    rows = json.loads(w.classifier_table_params())["rows"]
    assert rows == w.classifier_rows() and rows[0] == {"row": "cnn_eps0p2_seed0", "run": "cnn_eps0p2_seed0",
                                                       "classifier": "cnn", "eps_target": 0.2, "seed": 0}


def test_a_null_classifier_section_has_no_runs_but_a_run_asked_for_by_path_takes_the_schemas_settings(tmp_path):
    off = Wiring(house(tmp_path, lambda cfg: cfg["dpdm"].update(dpsgd_classifier=None)))
    assert off.classifier_runs() == [] and off.classifier_records() == []
    assert json.loads(off.classifier_params(wc("logreg_eps1_seed0")))["lr"] == 0.02


def test_an_unconditional_dpdm_has_no_classifier_runs_its_samples_carry_no_labels_to_compare_with(tmp_path):
    uncond = Wiring(house(tmp_path, lambda cfg: cfg["dpdm"].update(class_conditional=False)))
    assert uncond.classifier_runs() == [] and uncond.classifier_records() == []


# ---------------------------------------------------------------------------------------------- Fig. 3: variance vs K


def test_the_variance_figure_reads_the_public_denoiser_and_split_never_the_private_one(w, exp):
    assert VARIANCE_FIGURE == "dpdm_figure3_gradient_variance"
    assert w.variance_enabled
    assert w.variance_inputs == {"denoiser": exp / "models" / "public_edm.pt", "public": exp / "data" / "public.npz"}
    p = json.loads(w.variance_params())
    assert (p["K"], p["repeats"], p["n_images"], p["clip"]) == ([1, 2, 4, 8, 16], 24, 3, w.section["clip"])
    assert w.resources("dpdm_figure3_gradient_variance")["runtime"] >= 5


def test_the_variance_figure_is_left_out_when_null_or_without_a_public_split(tmp_path):
    off = Wiring(house(tmp_path, lambda cfg: cfg["dpdm"].update(gradient_variance=None)))
    assert not off.variance_enabled and json.loads(off.variance_params())["K"] == [1, 2, 4, 8, 16]
    assert off.table_path(VARIANCE_FIGURE) not in off.targets()
    no_public = Wiring(house(tmp_path, lambda cfg: cfg["data"]["public"].update(source="none")))
    assert not no_public.variance_enabled
    partial = Wiring(house(tmp_path, lambda cfg: cfg["dpdm"].update(gradient_variance={"repeats": 40})))
    assert json.loads(partial.variance_params())["repeats"] == 40 and partial.variance_enabled
