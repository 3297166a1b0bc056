"""STRAIGHTDP's wiring (pipeline/methods/straightdp/wiring.py): a run's files and params, the tables' inputs, the
targets, ledger transcripts and all_runs records, for config.yaml and variants of its straightdp section."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from pipeline.config import ConfigError, config_id, deep_merge, validate_config
from pipeline.methods.straightdp import costs
from pipeline.methods.straightdp.wiring import LISTING, OWN_SECTIONS, TABLES, Wiring
from pipeline.methods.straightdp.runs import LABELS, MAIN_ROW, StraightRun
from pipeline.wiring import House
from tests.methods import check_requests

ROOT = Path(__file__).parents[3]


def two_epsilon_grid() -> dict:
    """config.yaml with STRAIGHTDP's Table 1 at two epsilons and both LoRA rows (the reference run's grid; the
    quick tour keeps one epsilon): what these specifications are written against."""
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    s = cfg["straightdp"]
    s["epsilons"] = [0.3, 1]
    s["rows"] = [*s["rows"][:-1], "lora_uniform", s["rows"][-1]]
    s["arms"]["latent"]["epsilons"] = [0.3]
    return cfg


def wiring(tmp_path: Path, **sections) -> Wiring:
    """The two-epsilon grid (results under tmp_path) with ``sections`` merged over it key by key."""
    cfg = deep_merge(two_epsilon_grid(), {"results_dir": str(tmp_path / "r"), **sections})
    return Wiring(House.from_config(validate_config(cfg)))


def replaced(tmp_path: Path, **straightdp) -> Wiring:
    """The two-epsilon grid with these straightdp keys replaced whole (``arms={}`` drops every arm)."""
    cfg = two_epsilon_grid()
    cfg["results_dir"] = str(tmp_path / "r")
    cfg["straightdp"] = {**cfg["straightdp"], **straightdp}
    return Wiring(House.from_config(validate_config(cfg)))


def wc(run: str) -> SimpleNamespace:
    return SimpleNamespace(run=run)


@pytest.fixture
def w(tmp_path) -> Wiring:
    return wiring(tmp_path)


@pytest.fixture
def exp(w) -> Path:
    return w.layout.expdir


# ---------------------------------------------------------------------------------------------- files


def test_a_runs_files_sit_under_the_experiment_by_kind(w, exp):
    run = "tha_moments_eps0p3_seed1"
    assert w.root == exp / "straightdp"
    assert w.release_path(run) == exp / "straightdp" / "release" / f"{run}.npz"
    assert w.release_ledger(run) == exp / "ledger" / f"straightdp_release_{run}.jsonl"
    assert w.model_path(run) == exp / "models" / "straightdp" / f"{run}.pt"
    assert w.train_ledger(run) == exp / "ledger" / f"straightdp_train_{run}.jsonl"
    assert w.samples_path(run) == exp / "samples" / "straightdp" / f"{run}.npz"
    assert w.samples_manifest(run) == exp / "samples" / "straightdp" / f"{run}.json"
    assert w.metrics_path(run) == exp / "eval" / "straightdp" / run / "metrics.json"
    assert w.train_metrics(run) == exp / "train" / "straightdp" / f"{run}.json"
    # rule wildcards format into the same paths
    assert w.release_path("{run}") == exp / "straightdp" / "release" / "{run}.npz"


def test_the_public_files_and_the_one_off_transcripts(w, exp, tmp_path):
    assert w.public_split == exp / "data" / "straightdp_public.npz"
    assert w.code_sources == {"private_train": exp / "data" / "private_train.npz",
                              "straightdp_public": exp / "data" / "straightdp_public.npz"}
    assert w.toy_ledger == exp / "ledger" / "straightdp_toy.jsonl"
    assert w.table4_ledger == exp / "ledger" / "straightdp_table4_text.jsonl"
    assert w.table_path("table1_main") == tmp_path / "r" / "tables" / "straightdp_table1_main.parquet"
    assert w.figure_path("figure3_accuracy") == tmp_path / "r" / "figures" / "straightdp_figure3_accuracy.png"
    assert w.figure_path("figure3_accuracy", ".pdf").name == "straightdp_figure3_accuracy.pdf"


def test_the_main_configuration_shares_one_geometry_horizon_flow_and_autoencoder(w, exp):
    sdp = exp / "straightdp"
    assert w.arms_dir == sdp / "arms"
    assert w.geometry() == sdp / "geometry.npz" and w.horizon() == sdp / "horizon.json"
    assert w.public_flow() == exp / "models" / "straightdp" / "public_flow.pt"
    assert w.latent_dir() == sdp / "latent"
    assert w.autoencoder() == sdp / "latent" / "autoencoder.pt"
    assert w.autoencoder_metrics() == sdp / "latent" / "autoencoder.json"
    assert w.codes_path("{name}") == sdp / "latent" / "{name}_codes.npz"


def test_an_arm_has_its_own_public_flow_and_in_another_space_its_own_geometry(w, exp):
    """config.yaml's arms: latent (space latent) and low_b0 (pixel, like the main configuration)."""
    arms = exp / "straightdp" / "arms"
    assert w.public_flow("low_b0") == exp / "models" / "straightdp" / "arms" / "low_b0" / "public_flow.pt"
    assert w.public_flow("{arm}") == exp / "models" / "straightdp" / "arms" / "{arm}" / "public_flow.pt"
    assert w.arm_geometry("latent") == (arms / "latent" / "geometry.npz", arms / "latent" / "horizon.json")
    assert w.own_geometry("latent") and not w.own_geometry("low_b0") and not w.own_geometry("")
    assert w.geometry("latent") == arms / "latent" / "geometry.npz"
    assert w.horizon("latent") == arms / "latent" / "horizon.json"
    # a pixel arm reads the same public split as the main one, so its geometry too
    assert w.geometry("low_b0") == exp / "straightdp" / "geometry.npz"
    assert w.horizon("low_b0") == exp / "straightdp" / "horizon.json"
    assert w.latent_dir("latent") == arms / "latent" / "latent"
    assert w.autoencoder("latent") == arms / "latent" / "latent" / "autoencoder.pt"
    assert w.codes_path("private_train", "latent") == arms / "latent" / "latent" / "private_train_codes.npz"


def test_a_pixel_arm_of_a_latent_configuration_has_its_own_geometry(tmp_path):
    # an arm inherits the main space unless it names its own
    inherits = wiring(tmp_path, straightdp={"space": "latent"})
    assert inherits.latent() and inherits.latent("low_b0")
    w = wiring(tmp_path, straightdp={"space": "latent", "arms": {"low_b0": {"space": "pixel"}}})
    assert w.latent() and not w.latent("low_b0")
    assert w.own_geometry("low_b0")
    assert w.geometry("low_b0") == w.arms_dir / "low_b0" / "geometry.npz"
    assert w.public_data("low_b0") == w.public_split


def test_the_latent_variant_reads_codes_the_pixel_one_images(w, exp):
    assert not w.latent() and w.latent("latent") and not w.latent("low_b0")
    assert w.private_data() == exp / "data" / "private_train.npz"
    assert w.public_data() == exp / "data" / "straightdp_public.npz"
    lat = exp / "straightdp" / "arms" / "latent" / "latent"
    assert w.private_data("latent") == lat / "private_train_codes.npz"
    assert w.public_data("latent") == lat / "straightdp_public_codes.npz"


def test_the_sample_shape_is_the_images_or_the_codes(tmp_path, w):
    side = w.config["data"]["image_size"]
    assert w.sample_shape() == [1, side, side]
    assert w.sample_shape("latent") == [2, side // 4, side // 4]  # the schema's code_channels default
    own = wiring(tmp_path, straightdp={"arms": {"latent": {"autoencoder": {"code_channels": 3}}}})
    assert own.sample_shape("latent") == [3, side // 4, side // 4]
    rgb = wiring(tmp_path, data={"image_size": 32, "private": {"source": "cifar10"}})
    assert rgb.sample_shape() == [3, 32, 32]


# ---------------------------------------------------------------------------------------------- runs


def test_the_runs_are_the_grid_the_arms_and_table2s_references(w):
    s = w.config["straightdp"]
    assert len(w.runs()) == len(s["rows"]) * len(s["epsilons"]) * len(s["seeds"])
    assert w.runs()[0] == StraightRun("released_only", 0.3, 0)
    assert [r.name for r in w.arm_runs()] == ["latent-uniform_eps0p3_seed0", "latent-uniform_moments_eps0p3_seed0",
                                               "low_b0-uniform_moments_eps0p3_seed0",
                                               "low_b0-uniform_moments_eps1_seed0"]
    assert [r.arm for r in w.arm_runs("table2_ablation")] == ["low_b0", "low_b0"]
    # Table 2: the arm's runs, then their main twins (uniform_moments is in config.yaml's grid)
    assert [r.name for r in w.table2_runs("noise_sweep")] == [
        "low_b0-uniform_moments_eps0p3_seed0", "low_b0-uniform_moments_eps1_seed0",
        "uniform_moments_eps0p3_seed0", "uniform_moments_eps1_seed0"]
    assert w.table2_panels() == ["noise_sweep", "ablation"]
    assert w.all_runs() == [*w.runs(), *w.arm_runs()]


def test_table2s_references_outside_the_grid_are_built_too(tmp_path):
    w = replaced(tmp_path, rows=["tha_moments"])
    twins = [StraightRun("uniform_moments", e, 0) for e in (0.3, 1)]
    assert w.all_runs() == [*w.runs(), *w.arm_runs(), *twins]


def test_without_arms_there_is_no_table2(tmp_path):
    w = replaced(tmp_path, arms={})
    assert w.arm_runs() == [] and w.table2_panels() == [] and w.all_runs() == w.runs()


def test_a_run_wildcard_parses_and_a_bad_name_is_a_one_line_error(w):
    assert w.run(wc("low_b0-uniform_moments_eps1_seed0")) == StraightRun("uniform_moments", 1, 0, "low_b0")
    with pytest.raises(ConfigError, match=r"STRAIGHTDP run name 'nope' is not"):
        w.run(wc("nope"))


def test_an_unknown_arm_is_a_one_line_error(w):
    with pytest.raises(ConfigError, match=r"STRAIGHTDP arm 'ghost' is not in straightdp.arms \(latent, low_b0\)"):
        w.arm_section("ghost")


def test_an_arms_section_is_the_main_one_with_its_switches(w):
    main = w.arm_section()
    assert "arms" not in main and main["epsilons"] == [0.3, 1]
    low = w.arm_section("low_b0")
    assert low["flow"] == {**main["flow"], "stream_clamp": 16, "late_injection": 1, "decoupled_attention": True}
    assert low["rows"] == ["uniform_moments"] and low["delta"] == main["delta"]


# ---------------------------------------------------------------------------------------------- params


def test_every_rule_asks_for_its_request_in_straightdp_s_cost_model(w):
    requests = check_requests(w, "straightdp.smk", costs.REQUESTS)
    cfg = w.config
    # the rules' retries and runtimes count the wiring's flow (which knows the latent variant's codes)
    assert w.pretrain_runtime_min == costs.pretrain_runtime_min(cfg, w.flow_network) == requests[
        "pretrain_straightdp"]["runtime"]
    assert w.train_runtime_min == costs.train_runtime_min(cfg, w.flow_network) == requests["train_straightdp"][
        "runtime"]
    assert requests["sample_straightdp"]["runtime"] == costs.sample_runtime_min(cfg, w.flow_network)
    # each pretraining job's GPU memory is its own arm's plan; a training job's its run's
    per_arm = requests["pretrain_straightdp"]["gpu_mem_mb"]
    assert per_arm(SimpleNamespace(arm="latent")) == w.pretrain_gpu_mem_mb("latent")
    assert per_arm(SimpleNamespace()) == w.pretrain_gpu_mem_mb()
    assert requests["train_straightdp"]["gpu_mem_mb"] == w.train_gpu_mem_mb


def test_a_jobs_section_leaves_out_the_listing_keys_and_other_rules_subsections(w):
    sec = w.section()
    assert not set(LISTING) & set(sec) and not set(OWN_SECTIONS) & set(sec)
    assert {"flow", "release", "dpsgd", "delta"} <= set(sec)
    assert "toy" in w.section(keep=("toy",)) and "lora" not in w.section(keep=("toy",))


def test_straightdp_gpus_sets_a_training_jobs_processes_cores_and_memory_but_no_jobs_params(tmp_path, w):
    assert (w.train_gpus, w.train_threads) == (1, w.house.torch_threads)
    four = replaced(tmp_path, gpus=4)
    mem = (four.resources("train_straightdp")["mem_mb"], w.resources("train_straightdp")["mem_mb"])
    assert (four.train_gpus, four.train_threads, mem) == (4, 4 * w.train_threads, (4 * 6000, 6000))
    assert four.resources("train_straightdp")["gpu"] == 4
    assert four.private_run_params(wc("tha_moments_eps1_seed0"), train=True) == w.private_run_params(
        wc("tha_moments_eps1_seed0"), train=True)


def test_the_flows_are_sized_for_the_gpu_on_their_own_space_and_a_batch_that_fits_keeps_its_params(tmp_path, w):
    from pipeline import resources as cost

    # the latent arm's flow sees its codes, the main flow the images (as the house's pixel-space spec has it)
    assert w.flow_network() == costs.pixel_network(w.config)
    assert w.flow_network()["shape"] == w.sample_shape() != w.sample_shape("latent")
    assert w.flow_network("latent")["shape"] == w.sample_shape("latent")
    pre, dist = w.pretrain_memory(), w.distill_memory()
    assert pre == cost.memory_plan(w.config, "pretrain_straightdp", w.flow_network(),
                                   w.config["straightdp"]["pretrain"]["batch_size"], kind="flow_mmdit")
    assert pre.micro_batches == dist.micro_batches == 1 and w.pretrain_gpu_mem_mb() == pre.predicted_mb
    assert "batch_gpu" not in json.loads(w.pretrain_params()) and json.loads(w.pretrain_params())["seed"] == 0
    sgd = w.config["straightdp"]["dpsgd"]
    dpsgd = cost.dpsgd_memory(w.flow_network(), sgd["micro_batch"], sgd["noise_multiplicity"], kind="flow_mmdit")
    # a row with a release distils first: its job holds the larger of the two
    assert w.train_gpu_mem_mb(wc("tha_moments_eps1_seed0")) == max(dpsgd.predicted_mb, dist.predicted_mb)
    assert w.train_gpu_mem_mb(wc("uniform_eps1_seed0")) == dpsgd.predicted_mb
    # a GPU too small for the batches: pretraining and distillation are told their micro-batch, DP-SGD is not
    # (its micro-batch orders its draws: part of the run)
    small = wiring(tmp_path, slurm={"gpu_mem_gb": 1.68})
    assert small.pretrain_memory().micro_batch < small.pretrain_memory().batch
    assert json.loads(small.pretrain_params())["batch_gpu"] == small.pretrain_memory().micro_batch
    params = json.loads(small.private_run_params(wc("tha_moments_eps1_seed0"), train=True))
    assert params["batch_gpu"] == small.distill_memory().micro_batch
    assert "batch_gpu" not in json.loads(small.private_run_params(wc("uniform_eps1_seed0"), train=True))
    assert params["config_id"] == json.loads(w.private_run_params(wc("tha_moments_eps1_seed0"), train=True))[
        "config_id"]


def test_adding_an_eps_seed_or_arm_moves_no_jobs_params(tmp_path, w):
    more = replaced(tmp_path, epsilons=[0.3, 1, 3], seeds=[0, 1], arms={})
    assert more.params(seed=0) == w.params(seed=0)
    assert more.run_params(wc("tha_moments_eps0p3_seed0")) == w.run_params(wc("tha_moments_eps0p3_seed0"))


def test_stage_params_carry_the_section_runtime_keys_and_an_id_of_the_settings(w):
    p = json.loads(w.params(seed=0))
    assert p["straightdp"] == json.loads(json.dumps(w.section()))
    assert p["device"] == "auto" and p["threads"] == w.house.torch_threads and p["seed"] == 0
    assert p["config_id"] == config_id({"straightdp": p["straightdp"], "seed": 0})
    arm = json.loads(w.params(arm="low_b0", seed=0))
    assert arm["straightdp"]["flow"]["stream_clamp"] == 16 and arm["config_id"] != p["config_id"]


def test_only_a_lora_rows_training_reads_the_lora_section(w):
    lora = json.loads(w.run_params(wc("lora_uniform_eps1_seed0"), train=True))
    assert lora["straightdp"]["lora"] == {"rank": 4, "alpha": 4.0, "lr": 0.001} and lora["run"] == "lora_uniform_eps1_seed0"
    assert "lora" not in json.loads(w.run_params(wc("lora_uniform_eps1_seed0")))["straightdp"]
    assert "lora" not in json.loads(w.run_params(wc("uniform_eps1_seed0"), train=True))["straightdp"]


def test_a_private_stage_is_bound_to_its_run_and_reads_the_declared_private_set(w):
    p = json.loads(w.private_run_params(wc("uniform_moments_eps1_seed0"), train=True))
    assert p["ledger_binding"] == {"run": "uniform_moments_eps1_seed0", "experiment": "digits"}
    assert p["private"] == {"N": 2500, "n_classes": 10} and p["run"] == "uniform_moments_eps1_seed0"
    # the binding is a runtime key: it is not in the id
    q = json.loads(w.private_run_params(wc("uniform_moments_eps1_seed0")))
    assert q["config_id"] == p["config_id"]
    assert json.loads(w.private_run_params(wc("latent-uniform_eps0p3_seed0")))["straightdp"]["space"] == "latent"


def test_sampling_params_carry_the_shape_of_what_the_release_models(w):
    assert json.loads(w.sample_params(wc("uniform_eps1_seed0")))["shape"] == [1, 16, 16]
    assert json.loads(w.sample_params(wc("latent-uniform_eps0p3_seed0")))["shape"] == [2, 4, 4]


def test_the_public_autoencoder_and_code_params(tmp_path, w):
    pub = json.loads(w.public_params())
    assert pub["public"] == {"source": "printed_letters", "n": 5000, "path": None, "split": None}
    assert pub["stream"] == "straightdp.public" and pub["seed"] == 0 and pub["data"] == w.config["data"]
    assert "config_id" not in pub
    ae = json.loads(w.autoencoder_params())
    assert ae["autoencoder"] == {} and ae["seed"] == 0 and ae["threads"] == w.house.torch_threads
    own = wiring(tmp_path, straightdp={"arms": {"latent": {"autoencoder": {"width": 8}}}})
    assert json.loads(own.autoencoder_params("latent"))["autoencoder"] == {"width": 8}
    assert json.loads(own.autoencoder_params())["autoencoder"] == {}
    assert json.loads(w.codes_params("private_train")) == {"name": "private_train_codes"}


def test_evaluation_params_name_the_run(w):
    p = json.loads(w.evaluate_params("uniform_eps1_seed0", {"fid": True}))
    assert p == {"evaluation": {"fid": True}, "seed": 0, "device": "auto", "threads": w.house.torch_threads,
                 "name": "straightdp/uniform_eps1_seed0"}


def test_the_toy_and_table4_read_only_their_own_settings(w):
    toy = json.loads(w.toy_params())
    assert toy["toy_data"] == {"n": 2000, "n_modes": 8, "radius": 1.0, "std": 0.05}
    assert "toy" in toy["straightdp"] and "table4" not in toy["straightdp"] and "epsilons" not in toy["straightdp"]
    assert toy["ledger_binding"]["run"] == "straightdp_figure6_toy" and toy["threads"] == 1
    t4 = json.loads(w.table4_params())
    assert set(t4["straightdp"]) == {"delta", "release", "table4"}
    assert t4["private"] == {"N": 2500, "n_classes": 10}
    assert t4["ledger_binding"]["run"] == "straightdp_table4_text"


# ---------------------------------------------------------------------------------------------- job inputs


def test_stage1_reads_the_private_split_and_its_arms_geometry(w, exp):
    assert w.release_inputs(wc("tha_moments_eps1_seed0")) == {"data": exp / "data" / "private_train.npz",
                                                             "geometry": exp / "straightdp" / "geometry.npz"}
    lat = w.release_inputs(wc("latent-uniform_moments_eps0p3_seed0"))
    assert lat["geometry"] == w.arms_dir / "latent" / "geometry.npz"
    assert lat["data"].name == "private_train_codes.npz"


def test_stage2_starts_from_the_public_flow_and_a_distilling_row_reads_its_release(w):
    plain = w.train_inputs(wc("uniform_eps1_seed0"))
    assert set(plain) == {"data", "public", "init", "geometry", "horizon"}
    assert plain["init"] == w.public_flow()
    dist = w.train_inputs(wc("low_b0-uniform_moments_eps1_seed0"))
    assert dist["init"] == w.public_flow("low_b0")
    assert dist["moments"] == w.release_path("low_b0-uniform_moments_eps1_seed0")
    assert dist["release_ledger"] == w.release_ledger("low_b0-uniform_moments_eps1_seed0")


def test_samples_come_from_the_release_the_guided_flow_or_the_model(w):
    assert w.sample_inputs(wc("released_only_eps1_seed0")) == {"moments": w.release_path("released_only_eps1_seed0")}
    assert w.sample_inputs(wc("public_guidance_eps1_seed0")) == {
        "moments": w.release_path("public_guidance_eps1_seed0"), "model": w.public_flow()}
    assert w.sample_inputs(wc("tha_moments_eps1_seed0")) == {"model": w.model_path("tha_moments_eps1_seed0")}
    assert w.sample_inputs(wc("latent-uniform_eps0p3_seed0")) == {
        "model": w.model_path("latent-uniform_eps0p3_seed0"), "autoencoder": w.autoencoder("latent")}
    # the rule and the run's bundle read the same files: one answer, from the run
    for name in ("released_only_eps1_seed0", "public_guidance_eps1_seed0", "latent-uniform_eps0p3_seed0"):
        assert w.sampler_reads(w.run(wc(name))) == w.sample_inputs(wc(name))


# ---------------------------------------------------------------------------------------------- tables, figures


def test_a_tables_runs_are_its_rows_and_table1_also_its_arms(w):
    t1 = w.table_runs("table1_main")
    assert t1[-len(w.arm_runs("table1_main")):] == w.arm_runs("table1_main")
    assert {r.row for r in w.table_runs("table3_frozen")} == {"public_guidance", "lora_uniform", "lora_moments"}
    assert w.table_runs() == w.runs()  # Figure 3: every main run


def test_a_tables_inputs_are_each_runs_metrics_and_transcripts(w):
    runs = [StraightRun("released_only", 1, 0), StraightRun("uniform", 1, 0), StraightRun("tha_moments", 1, 0)]
    assert w.run_inputs(runs) == {
        "metrics_released_only_eps1_seed0": w.metrics_path("released_only_eps1_seed0"),
        "release_released_only_eps1_seed0": w.release_ledger("released_only_eps1_seed0"),
        "metrics_uniform_eps1_seed0": w.metrics_path("uniform_eps1_seed0"),
        "train_uniform_eps1_seed0": w.train_ledger("uniform_eps1_seed0"),
        "metrics_tha_moments_eps1_seed0": w.metrics_path("tha_moments_eps1_seed0"),
        "release_tha_moments_eps1_seed0": w.release_ledger("tha_moments_eps1_seed0"),
        "train_tha_moments_eps1_seed0": w.train_ledger("tha_moments_eps1_seed0")}
    assert w.run_inputs(runs[1:2], grad=True)["grad_uniform_eps1_seed0"] == w.train_metrics("uniform_eps1_seed0")
    assert w.table_inputs("table3_frozen") == w.run_inputs(w.table_runs("table3_frozen"))
    t2 = w.table2_inputs("noise_sweep")
    assert t2 == w.run_inputs(w.table2_runs("noise_sweep"), grad=True)
    assert not any(k.startswith("grad_") for k in w.table2_inputs("ablation"))


def test_table_params_list_the_runs_and_budgets(tmp_path, w):
    p = json.loads(w.table_params("table1_main"))
    assert p["table"] == "table1_main" and p["runs"] == [r.name for r in w.table_runs("table1_main")]
    assert p["epsilons"] == [0.3, 1] and p["seed"] == 0
    assert "table" not in json.loads(w.table_params())
    # a budget only an arm ran comes after the main grid's
    arm3 = wiring(tmp_path, straightdp={"arms": {"latent": {"epsilons": [3]}}})
    assert json.loads(arm3.table_params("table1_main"))["epsilons"] == [0.3, 1, 3.0]
    t2 = json.loads(w.table2_params("ablation"))
    assert t2["panel"] == "ablation" and t2["runs"] == [r.name for r in w.table2_runs("ablation")]


def test_figure5_shows_every_row_at_the_largest_eps_first_seed(w):
    grid = w.grid_inputs()
    assert list(grid) == w.config["straightdp"]["rows"]
    assert grid["uniform"] == w.samples_path("uniform_eps1_seed0")
    assert w.grid_titles()["tha_moments"] == LABELS["tha_moments"]
    p = json.loads(w.grid_params())
    assert p == {"per_class": 8, "titles": w.grid_titles(), "title": "STRAIGHTDP samples at eps = 1"}


# ---------------------------------------------------------------------------------------------- registrations


def test_config_yaml_targets_every_table_and_figure(w, tmp_path):
    tables, figures = tmp_path / "r" / "tables", tmp_path / "r" / "figures"
    assert w.targets() == [
        *(tables / f"straightdp_{t}.parquet" for t in TABLES),
        tables / "straightdp_table2_noise_sweep.parquet", tables / "straightdp_table2_ablation.parquet",
        figures / "straightdp_figure2_horizon.png", figures / "straightdp_figure3_accuracy.png",
        figures / "straightdp_figure5_samples.png",
        tables / "straightdp_figure6_toy.parquet", figures / "straightdp_figure6_toy.png",
        tables / "straightdp_table4_text.parquet"]


def test_switched_off_parts_leave_the_targets(tmp_path):
    w = wiring(tmp_path, data={"toy": {"enabled": False}}, straightdp={"table4": {"enabled": False}})
    assert not w.toy_enabled() and not w.table4_enabled()
    names = {p.name for p in w.targets()}
    assert not {"straightdp_figure6_toy.parquet", "straightdp_table4_text.parquet"} & names
    # Table 4 composes grey digits: an RGB configuration has none
    assert not wiring(tmp_path, data={"image_size": 32, "private": {"source": "cifar10"}}).table4_enabled()
    # no LoRA row: no Table 3 (guidance alone is Table 1's); no arms: no Table 2
    w = replaced(tmp_path, rows=["public_guidance", "uniform"], arms={})
    names = {p.name for p in w.targets()}
    assert "straightdp_table3_frozen.parquet" not in names and "straightdp_table1_main.parquet" in names
    assert not any(n.startswith("straightdp_table2_") for n in names)


def test_every_private_job_has_one_transcript_bound_to_its_run(w):
    tr = w.transcripts()
    run = "low_b0-uniform_moments_eps1_seed0"
    release = tr[w.release_ledger(run)]
    assert (release.claims, release.run, release.stage, release.delta, release.data) == (
        1, run, "release_moments", 1e-05, str(w.private_data("low_b0")))
    assert tr[w.train_ledger(run)].stage == "train_straightdp"
    lat = "latent-uniform_eps0p3_seed0"
    assert tr[w.train_ledger(lat)].data == str(w.private_data("latent")) and w.release_ledger(lat) not in tr
    n_release = sum(r.releases for r in w.all_runs())
    n_train = sum(r.trains for r in w.all_runs())
    assert len(tr) == n_release + n_train + 2  # + the toy's and Table 4's


# the shares of config.yaml's release: Stage 1 targets weight / (weight + sgd_weight) = 0.2 / 0.85 of a run's eps
SHARE = 0.2 / 0.85


def test_a_release_is_registered_with_its_declared_set_its_pca_rank_and_its_share_of_eps(w):
    spec = w.transcripts()[w.release_ledger("uniform_moments_eps0p3_seed0")]
    # N and the classes are the declared private set's, p the release's; R is measured on the public set: not here
    assert spec.params == ({"extra.N": 2500, "extra.n_classes": 10, "extra.p": 32, "count": 1,
                            "extra.target_epsilon": pytest.approx(0.3 * SHARE), "extra.total_epsilon": 0.3},)
    assert spec.params == (w.release_params(StraightRun.from_name("uniform_moments_eps0p3_seed0")),)
    # its noise was calibrated to its share alone (nothing composed before it)
    assert spec.epsilon_target == (pytest.approx(0.3 * SHARE),) and spec.after == () and spec.rtol == 1e-3
    # a row that spends the whole eps on the release
    alone = w.transcripts()[w.release_ledger("released_only_eps1_seed0")]
    assert alone.epsilon_target == (1.0,) and alone.params[0]["extra.target_epsilon"] == 1.0


def test_a_uniform_dpsgd_line_without_a_release_is_registered_whole_but_its_noise(w):
    spec = w.transcripts()[w.train_ledger("uniform_eps1_seed0")]
    # config.yaml: 30 steps, expected batch 64 of N = 2500, one bucket on [0, 1] clipped at C_ref = 1
    assert spec.params == ({"sampling.n": 2500, "sampling.probability": pytest.approx(64 / 2500),
                            "extra.expected_batch_size": pytest.approx(64.0), "count": 30, "extra.T_k": [30],
                            "extra.edges": [0.0, 1.0], "extra.tau": 0.0, "extra.C_k": [1.0], "extra.beta": 0.0,
                            "extra.total_target_epsilon": 1.0, "extra.composed_with_release": False},)
    assert spec.params == (w.train_params(StraightRun.from_name("uniform_eps1_seed0")),)
    assert spec.epsilon_target == (1.0,) and spec.after == ()


def test_a_distilling_rows_dpsgd_is_calibrated_after_its_release_and_leaves_out_the_measured_horizon(w):
    tr = w.transcripts()
    for name in ("uniform_moments_eps1_seed0", "lora_moments_eps1_seed0", "low_b0-uniform_moments_eps0p3_seed0"):
        spec = tr[w.train_ledger(name)]
        assert spec.after == (str(w.release_ledger(name)),) and spec.epsilon_target == (StraightRun.from_name(
            name).epsilon,)
        # tau (and so the edges) is the knee of a curve measured on the public set: not the configuration's
        assert "extra.edges" not in spec.params[0] and "extra.tau" not in spec.params[0]
        assert spec.params[0]["extra.C_k"] == [1.0] and spec.params[0]["extra.composed_with_release"] is True


def test_a_tha_plan_registers_its_buckets_steps_but_not_the_clips_its_public_proxy_picks(w, tmp_path):
    spec = w.transcripts()[w.train_ledger("tha_moments_eps1_seed0")]
    # K = 4 buckets, T = 30 round robin: 8, 8, 7, 7
    assert spec.params[0]["extra.T_k"] == [8, 8, 7, 7] and spec.params[0]["count"] == 30
    assert not {"extra.C_k", "extra.beta", "extra.edges", "extra.tau"} & set(spec.params[0])
    # without a release (row tha) the buckets' edges are known: tau = 0
    no_release = replaced(tmp_path / "tha", rows=["tha"], arms={})
    tha = no_release.transcripts()[no_release.train_ledger("tha_eps1_seed0")]
    assert tha.params[0]["extra.edges"] == [0.0, 0.25, 0.5, 0.75, 1.0] and "extra.C_k" not in tha.params[0]
    assert tha.after == ()


def test_the_registered_parameters_follow_the_configuration(tmp_path):
    w = wiring(tmp_path, straightdp={"epsilons": [2], "dpsgd": {"batch_size": 50, "steps": 41, "buckets": 3,
                                                                  "clip_ref": 0.5},
                                     "release": {"p": 16, "weight": 0.5, "sgd_weight": 0.5}},
               data={"private": {"n_private_train": 2000}})
    tr = w.transcripts()
    release, train = tr[w.release_ledger("tha_moments_eps2_seed0")], tr[w.train_ledger("tha_moments_eps2_seed0")]
    assert release.params[0]["extra.N"] == 2000 and release.params[0]["extra.p"] == 16
    assert release.epsilon_target == (1.0,)  # half of eps 2
    assert train.epsilon_target == (2.0,)
    t = train.params[0]
    assert (t["sampling.n"], t["count"], t["extra.T_k"]) == (2000, 41, [14, 14, 13])
    assert t["sampling.probability"] == pytest.approx(50 / 2000) and t["extra.expected_batch_size"] == pytest.approx(50)
    uniform = tr[w.train_ledger("uniform_eps2_seed0")].params[0]
    assert uniform["extra.C_k"] == [0.5] and uniform["extra.T_k"] == [41]


def test_the_toy_registers_each_points_lines_in_the_order_the_stage_writes_them(w):
    spec = w.transcripts()[w.toy_ledger]
    assert (spec.claims, spec.run, spec.stage, spec.delta, spec.data) == (
        12, "straightdp_figure6_toy", "straightdp_figure6_toy", 1e-05, str(w.layout.split("toy")))
    assert w.toy_claims() == 4 * 3 * 1  # 3 toy epsilons, 1 seed
    # per point (seed 0; eps 0.1, 0.3, 1): moments only, uniform DP-SGD, StraightDP's release then its DP-SGD
    runs = [p["extra.run"] for p in spec.params]
    assert runs[:4] == ["released_only_eps0p1_seed0", "uniform_eps0p1_seed0", "tha_moments_eps0p1_seed0",
                        "tha_moments_eps0p1_seed0"]
    moments_only, uniform, release, straight = spec.params[:4]
    # data.toy: N 2000 points of 8 modes; the release keeps both dimensions of the plane
    assert moments_only == {"extra.N": 2000, "extra.n_classes": 8, "extra.p": 2, "count": 1, "seed": 0,
                            "extra.run": "released_only_eps0p1_seed0"}
    # the toy's own DP-SGD: 300 steps, batch 200 of 2000
    assert uniform["count"] == 300 and uniform["sampling.probability"] == pytest.approx(0.1)
    assert uniform["extra.C_k"] == [1.0] and uniform["extra.edges"] == [0.0, 1.0]
    assert straight["extra.T_k"] == [75] * 4 and straight["extra.composed_with_release"] is True
    # every noise is calibrated to its point's eps; StraightDP's DP-SGD composed after its release, the line just
    # before it
    assert spec.epsilon_target[:4] == (0.1, 0.1, pytest.approx(0.1 * SHARE), 0.1)
    assert spec.epsilon_target[8:] == (1.0, 1.0, pytest.approx(SHARE), 1.0)
    assert spec.prior_lines[:4] == ((), (), (), (2,)) and spec.prior_lines[8:] == ((), (), (), (10,))
    assert list(zip(spec.params, spec.epsilon_target, spec.prior_lines)) == w.toy_line_specs()


def test_the_toys_registration_follows_its_settings(tmp_path):
    w = wiring(tmp_path, straightdp={"toy": {"epsilons": [0.5], "seeds": [3, 4], "dpsgd_steps": 10,
                                             "dpsgd_batch_size": 100}}, data={"toy": {"n": 1000}})
    spec = w.transcripts()[w.toy_ledger]
    assert spec.claims == 8 and [p["seed"] for p in spec.params] == [3] * 4 + [4] * 4
    uniform = spec.params[1]
    assert (uniform["sampling.n"], uniform["count"]) == (1000, 10)
    assert uniform["sampling.probability"] == pytest.approx(0.1) and spec.params[0]["extra.N"] == 1000


def test_table4_registers_each_release_with_its_featurisations_width_and_radius(w):
    spec = w.transcripts()[w.table4_ledger]
    assert (spec.claims, spec.run, spec.stage, spec.data) == (
        18, "straightdp_table4_text", "straightdp_table4_text", str(w.layout.split("private_train")))
    assert w.table4_claims() == 2 * 3 * 3  # 2 featurisations x 3 epsilons x 3 seeds
    # featurisation, then eps, then seed; the caption codings' public widths and radii (intercept included): the
    # class one-hot (10 + 1 wide, centred norm sqrt(0.9)) and the slot indicators (16 + 1, sqrt(2.15))
    first, last = spec.params[0], spec.params[-1]
    assert first == {"extra.N": 2500, "extra.p": 32, "extra.q": 11, "extra.R_txt": pytest.approx(math.sqrt(1.8)),
                     "count": 1, "seed": 0, "extra.featurisation": "one_hot_class", "extra.target_epsilon": 0.3}
    assert (last["extra.q"], last["extra.R_txt"], last["seed"], last["extra.featurisation"]) == (
        17, pytest.approx(math.sqrt(4.3)), 2, "slot_indicators")
    assert spec.epsilon_target == (0.3,) * 3 + (1.0,) * 3 + (3.0,) * 3 + (0.3,) * 3 + (1.0,) * 3 + (3.0,) * 3
    assert [(p, t) for p, t in w.table4_line_specs()] == list(zip(spec.params, spec.epsilon_target))


def test_every_transcript_registration_survives_the_replays_params(w):
    # rule replay passes each registration as JSON (TranscriptSpec.as_dict) and the stage reads it back
    from pipeline.privacy.replay import registered_from_params

    for path, spec in w.transcripts().items():
        if spec.data:  # the stage reads each split's manifest
            Path(spec.data).parent.mkdir(parents=True, exist_ok=True)
            Path(spec.data).with_suffix(".json").write_text(json.dumps({"sha256": "0" * 64, "n": 2500}))
    expected = {Path(p).stem: s.as_dict() for p, s in w.transcripts().items()}
    regs = registered_from_params(json.loads(json.dumps(expected)), "digits")
    train = regs["straightdp_train_uniform_moments_eps1_seed0"]
    assert train.after == ("straightdp_release_uniform_moments_eps1_seed0",)
    assert train.params[0]["extra.composed_with_release"] is True


def test_all_runs_records_every_run_with_its_transcripts_and_benchmarks(w):
    recs = {r.config: r for r in w.records()}
    assert list(recs) == [r.name for r in w.all_runs()]
    r = recs["tha_moments_eps1_seed0"]
    assert r.method == "straightdp" and r.seed == 0 and r.epsilon_target == 1.0 and r.in_figure
    # the paper's full method is the headline's only candidate: no control row, no arm
    assert {x.config.split("_eps")[0] for x in recs.values() if x.headline} == {MAIN_ROW} == {"tha_moments"}
    assert r.ledgers == (str(w.release_ledger(r.config)), str(w.train_ledger(r.config)))
    assert r.label == f"STRAIGHTDP: {LABELS['tha_moments']}" and r.metrics == str(w.metrics_path(r.config))
    bench = w.layout.benchmarks
    assert r.benchmarks == tuple(str(bench / rule / f"{r.config}.tsv") for rule in
                                 ("release_moments", "train_straightdp", "sample_straightdp", "evaluate_straightdp"))
    assert recs["released_only_eps1_seed0"].ledgers == (str(w.release_ledger("released_only_eps1_seed0")),)
    arm = recs["low_b0-uniform_moments_eps1_seed0"]
    assert not arm.in_figure and not arm.headline and arm.label.startswith("STRAIGHTDP [low_b0]: ")


# ---------------------------------------------------------------------------------------------- an imported flow

def imported(tmp_path: Path, **files) -> dict:
    """config.yaml whose main public flow is the user's SD3 folder (straightdp.pretrain.source: diffusers)."""
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    return validate_config(deep_merge(cfg, {"results_dir": str(tmp_path / "r"),
                                            "straightdp": {"pretrain": {"source": "diffusers", **files}}}))


def test_the_files_hashes_are_in_the_config_id_of_every_main_run_that_reads_the_flow(tmp_path):
    from tests.public_models import save_label_tables, save_sd3

    def ids(cfg):
        w = Wiring(House.from_config(cfg))
        return {"train": json.loads(w.private_run_params(wc("tha_moments_eps1_seed0"), train=True))["config_id"],
                "lora": json.loads(w.private_run_params(wc("lora_uniform_eps1_seed0"), train=True))["config_id"],
                "guided": json.loads(w.sample_params(wc("public_guidance_eps1_seed0")))["config_id"],
                "import": json.loads(w.import_params())["config_id"]}

    save_sd3(tmp_path / "m", sample_size=16)
    save_label_tables(tmp_path / "l.safetensors", n_classes=10)
    files = {"path": str(tmp_path / "m"), "label_embeddings": str(tmp_path / "l.safetensors")}
    w = Wiring(House.from_config(imported(tmp_path, **files)))
    assert w.imports_public_flow and set(w.public_model()["public_model"]) == {"source", "sha256",
                                                                              "label_embeddings_sha256"}
    # a release reads no flow, an arm pretrains its own: neither moves with the imported files
    assert "public_model" not in json.loads(w.private_run_params(wc("released_only_eps1_seed0")))
    arm = json.loads(w.private_run_params(wc("low_b0-uniform_moments_eps1_seed0"), train=True))
    assert "public_model" not in arm and set(arm["straightdp"]["pretrain"]) == {"steps", "batch_size", "lr",
                                                                                "ema_decay", "p_uncond"}
    first = ids(imported(tmp_path, **files))
    save_label_tables(tmp_path / "l.safetensors", n_classes=10, seed=1)
    second = ids(imported(tmp_path, **files))
    assert all(first[k] != second[k] for k in first), (first, second)
    trained = Wiring(House.from_config(validate_config({"results_dir": str(tmp_path / "r")})))
    assert not trained.imports_public_flow and trained.public_model() == {}


def test_every_run_has_a_bundle_of_what_its_sampler_reads(w, exp):
    assert w.bundle_runs() == [r.name for r in w.all_runs()]
    tha = w.bundle("tha_moments_eps1_seed0")  # released moments, then the flow trained on them: both lines
    assert tha.kind == "model" and tha.model == str(w.model_path("tha_moments_eps1_seed0")) and tha.parts == {}
    assert tha.transcripts == (str(w.release_ledger("tha_moments_eps1_seed0")),
                               str(w.train_ledger("tha_moments_eps1_seed0")))
    smp = w.arm_section()["sampling"]
    assert tha.sampling == {"sampler": "straightdp_flow", "samples_from": "model", "steps": smp["steps"],
                            "guidance": smp["guidance"], "batch_size": smp["batch_size"],
                            "n_samples": smp["n_samples"], "seed": 0, "threads": w.house.torch_threads}
    assert len(tha.covers) == 3 and "composed" in tha.covers[-1]
    lora = w.bundle("lora_uniform_eps1_seed0")
    assert lora.kind == "model" and lora.transcripts == (str(w.train_ledger("lora_uniform_eps1_seed0")),)
    assert "LoRA adapters" in lora.covers[0]
    # from the release alone: the release (and the shape it models); guided: the release and the public flow
    released = w.bundle("released_only_eps1_seed0")
    assert released.kind == "model" and released.model is None
    assert released.parts == {"moments": str(w.release_path("released_only_eps1_seed0"))}
    assert released.sampling["samples_from"] == "release" and released.sampling["shape"] == [1, 16, 16]
    assert released.transcripts == (str(w.release_ledger("released_only_eps1_seed0")),)
    guided = w.bundle("public_guidance_eps1_seed0")
    assert guided.parts == {"moments": str(w.release_path("public_guidance_eps1_seed0")),
                            "public_flow": str(w.public_flow(""))}
    assert guided.sampling["samples_from"] == "guided" and guided.sampling["t0"] == 0.2 and guided.model is None
    # the latent arm's flow is decoded by its public autoencoder: both ship
    latent = next(r for r in w.all_runs() if r.arm and w.latent(r.arm) and r.trains)
    b = w.bundle(latent.name)
    assert b.model == str(w.model_path(latent.name)) and b.parts == {"autoencoder": str(w.autoencoder(latent.arm))}
    assert any("autoencoder" in c for c in b.not_covered)
