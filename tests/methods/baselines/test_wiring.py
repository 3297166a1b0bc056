"""The baselines' wiring (pipeline/methods/baselines/wiring.py): a run's files and params, its transcript, the
runs all_runs.parquet reads."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace


import pytest

from pipeline.baselines.runs import BaselineRun
from pipeline.methods.baselines import costs
from pipeline.methods.baselines.wiring import LISTING, Wiring
from pipeline.wiring import House
from tests.methods import check_requests, house


def test_the_runs_are_methods_by_epsilons_by_seeds(tmp_path):
    bl = Wiring(house(tmp_path))
    # the quick tour: every baseline at eps 1
    assert [r.name for r in bl.runs()] == ["dp_merf_eps1_seed0", "pe_eps1_seed0", "dp_hp_eps1_seed0",
                                           "dp_ntk_eps1_seed0", "dp_mepf_eps1_seed0", "dp_diffusion_eps1_seed0",
                                           "privimage_eps1_seed0", "dp_ldm_eps1_seed0", "dp_promise_eps1_seed0"]
    assert bl.targets() == [tmp_path / "r" / "tables" / "baselines.parquet"] == [bl.table]
    assert bl.section == bl.house.config["baselines"] and bl.section["epsilons"] == [1]

    def two_epsilons(cfg):
        cfg["baselines"]["epsilons"] = [1, 10]
        cfg["baselines"]["dp_hp"]["epsilons"] = [1]

    # a method's own epsilons replace baselines.epsilons; the others run at every one
    names = [r.name for r in Wiring(house(tmp_path, two_epsilons)).runs()]
    assert names[:7] == ["dp_merf_eps1_seed0", "dp_merf_eps10_seed0", "pe_eps1_seed0", "pe_eps10_seed0",
                         "dp_hp_eps1_seed0", "dp_ntk_eps1_seed0", "dp_ntk_eps10_seed0"]


def test_a_run_has_its_samples_manifest_train_metrics_ledger_and_evaluation(tmp_path):
    bl, exp = Wiring(house(tmp_path)), tmp_path / "r" / "digits"
    assert bl.samples_path("pe_eps1_seed0") == exp / "samples" / "baselines" / "pe_eps1_seed0.npz"
    assert bl.manifest_path("pe_eps1_seed0") == exp / "samples" / "baselines" / "pe_eps1_seed0.json"
    assert bl.train_metrics_path("pe_eps1_seed0") == exp / "train" / "baselines" / "pe_eps1_seed0.json"
    assert bl.ledger_path("pe_eps1_seed0") == exp / "ledger" / "baselines_pe_eps1_seed0.jsonl"
    assert bl.metrics_path("pe_eps1_seed0") == exp / "eval" / "baselines" / "pe_eps1_seed0" / "metrics.json"
    # wildcards pass through unchanged: the rule's patterns
    assert bl.samples_path("{run}") == exp / "samples" / "baselines" / "{run}.npz"


def test_a_runs_params_leave_out_the_listing_so_adding_an_eps_reruns_nothing(tmp_path):
    h = house(tmp_path)
    p = json.loads(Wiring(h).params(SimpleNamespace(run="pe_eps1_seed0")))
    assert set(LISTING) == {"methods", "epsilons", "seeds"}
    assert not set(LISTING) & set(p["baselines"])
    assert p["baselines"]["pe"] == h.config["baselines"]["pe"] and p["baselines"]["delta"] == 1e-5
    assert p["run"] == "pe_eps1_seed0" and p["private"] == {"N": 2500, "n_classes": 10}
    assert p["ledger_binding"] == {"run": "pe_eps1_seed0", "experiment": "digits"}
    assert p["threads"] == h.torch_threads and p["device"] == h.config["device"]

    def more(cfg):
        cfg["baselines"].update(epsilons=[1, 10, 100], seeds=[0, 1])
    assert Wiring(house(tmp_path, more)).params(SimpleNamespace(run="pe_eps1_seed0")) == \
        Wiring(h).params(SimpleNamespace(run="pe_eps1_seed0"))


def test_private_evolution_reads_clip_only_with_the_clip_embedding(tmp_path):
    h = house(tmp_path)
    assert Wiring(h).pe_inputs() == {}
    cfg = copy.deepcopy(dict(h.config))
    cfg["baselines"]["pe"]["embedding"] = "clip"
    assert Wiring(House(cfg, h.layout, 1)).pe_inputs() == {"clip": tmp_path / "r" / "digits" / "clip" / "clip.pt"}


def test_the_evaluation_of_a_run_is_named_after_it(tmp_path):
    p = json.loads(Wiring(house(tmp_path)).evaluate_params(SimpleNamespace(run="dp_merf_eps1_seed0")))
    assert p["name"] == "baselines/dp_merf_eps1_seed0" and p["evaluation"]["clip"] == {"enabled": True}


def test_each_run_writes_one_line_per_transcript_bound_to_it_and_its_stage(tmp_path):
    bl = Wiring(house(tmp_path))
    specs = bl.transcripts()
    # one transcript per run; PrivImage's query and DP-Promise's phase I have their own
    assert sorted(specs) == sorted([bl.ledger_path(r.name) for r in bl.runs()]
                                   + [bl.query_ledger_path("privimage_eps1_seed0"),
                                      bl.phase1_ledger_path("dp_promise_eps1_seed0")])
    assert all(s.claims == 1 for s in specs.values())
    pe = specs[bl.ledger_path("pe_eps1_seed0")].as_dict()
    assert pe["claims"] == 1 and pe["run"] == "pe_eps1_seed0" and pe["stage"] == "private_evolution"
    assert pe["delta"] == 1e-5 and pe["data"] == str(tmp_path / "r" / "digits" / "data" / "private_train.npz")
    assert specs[bl.ledger_path("dp_merf_eps1_seed0")].stage == "dp_merf"


def test_each_line_is_held_to_what_the_configuration_ran_and_to_the_eps_its_noise_was_calibrated_to(tmp_path):
    bl = Wiring(house(tmp_path))
    specs, sec = bl.transcripts(), bl.section
    merf = specs[bl.ledger_path("dp_merf_eps1_seed0")]
    # the mean's divisor m is the declared N (a public constant), never the data's size
    assert merf.params == ({"extra.m": 2500, "extra.n_classes": 10, "count": 1,
                            "extra.n_features": sec["dp_merf"]["n_features"]},)
    assert specs[bl.ledger_path("dp_hp_eps1_seed0")].params == ({"extra.m": 2500, "extra.n_classes": 10, "count": 1},)
    T = sec["pe"]["iterations"]
    assert specs[bl.ledger_path("pe_eps1_seed0")].params == ({"extra.iterations": T, "count": T},)
    own = sec["dp_diffusion"]
    assert specs[bl.ledger_path("dp_diffusion_eps1_seed0")].params == ({
        "sampling.scheme": "poisson", "sampling.n": 2500, "extra.expected_batch_size": own["batch_size"],
        "count": -(-own["epochs"] * 2500 // own["batch_size"]), "extra.max_grad_norm": own["clip"]},)
    # every noise is calibrated: to the run's eps, PrivImage's query to its share and DP-SGD after it
    query, dpsgd = specs[bl.query_ledger_path("privimage_eps1_seed0")], specs[bl.ledger_path("privimage_eps1_seed0")]
    assert query.params == ({"extra.k": sec["privimage"]["k"]},)
    assert query.epsilon_target == (sec["privimage"]["query_share"],) and query.after == ()
    assert dpsgd.epsilon_target == (1.0,) and dpsgd.after == (str(bl.query_ledger_path("privimage_eps1_seed0")),)
    assert all(s.epsilon_target[0] is not None for s in specs.values())
    # DP-Promise's two phases share one configured DP-SGD
    promise = next(r for r in bl.runs() if r.method == "dp_promise")
    assert specs[bl.phase1_ledger_path(promise.name)].params == specs[bl.ledger_path(promise.name)].params == (
        bl.line_params(promise),)
    # an edited configuration is what the replay then holds the line to
    edited = Wiring(house(tmp_path, lambda c: c["baselines"]["dp_diffusion"].update(batch_size=100, epochs=2)))
    assert edited.transcripts()[bl.ledger_path("dp_diffusion_eps1_seed0")].params[0]["count"] == 50


def test_all_runs_records_one_per_run_with_its_cost(tmp_path):
    bl, exp = Wiring(house(tmp_path)), tmp_path / "r" / "digits"
    recs = bl.records()
    assert [r.config for r in recs] == [r.name for r in bl.runs()]
    merf = recs[0]
    assert (merf.method, merf.seed, merf.epsilon_target, merf.label) == ("dp_merf", 0, 1.0, "DP-MERF")
    assert Path(merf.metrics) == bl.metrics_path("dp_merf_eps1_seed0")
    assert [Path(p) for p in merf.ledgers] == [bl.ledger_path("dp_merf_eps1_seed0")]
    assert [Path(p) for p in recs[1].benchmarks] == [exp / "benchmarks" / "private_evolution" / "pe_eps1_seed0.tsv",
                                                     exp / "benchmarks" / "evaluate_baseline" / "pe_eps1_seed0.tsv"]
    assert recs[1].label == "Private Evolution" and recs[1].private


def test_dp_merf_ships_its_generator_and_private_evolution_its_synthetic_set(tmp_path):
    bl, exp = Wiring(house(tmp_path)), tmp_path / "r" / "digits"
    assert bl.bundle_runs() == [r.name for r in bl.runs()]
    b = bl.bundle("pe_eps1_seed0")
    assert b.kind == "synthetic" and b.model is None and b.sampling is None and b.epsilon_target == 1
    assert (b.samples, b.metrics, b.transcripts) == (str(bl.samples_path("pe_eps1_seed0")),
                                                     str(bl.metrics_path("pe_eps1_seed0")),
                                                     (str(bl.ledger_path("pe_eps1_seed0")),))
    merf = bl.bundle("dp_merf_eps1_seed0")
    assert bl.generator_path("dp_merf_eps1_seed0") == exp / "models" / "baselines" / "dp_merf_eps1_seed0.safetensors"
    assert merf.kind == "model" and merf.model == str(bl.generator_path("dp_merf_eps1_seed0"))
    n = bl.section["n_samples"]
    assert merf.sampling == {"sampler": "dp_merf", "stream": "dp_merf.generator", "seed": 0, "n_samples": n,
                             "batch_size": n, "threads": bl.house.torch_threads}
    assert "histogram" in b.covers[0] and "mean embedding" in merf.covers[0]
    with pytest.raises(ValueError, match="no run 'pe_eps3_seed0'"):
        bl.bundle("pe_eps3_seed0")


def test_a_successor_without_its_own_epsilons_runs_at_the_sections(tmp_path):
    def unset(cfg):
        cfg["baselines"].update(methods=["dp_ntk"], epsilons=[1, 10], dp_ntk={"epsilons": None})
    assert [r.name for r in Wiring(house(tmp_path, unset)).runs()] == ["dp_ntk_eps1_seed0", "dp_ntk_eps10_seed0"]


def test_a_runs_params_carry_its_own_subsections_so_tuning_another_method_reruns_nothing(tmp_path):
    h = house(tmp_path)
    hp = json.loads(Wiring(h).params(SimpleNamespace(run="dp_hp_eps1_seed0")))["baselines"]
    # DP-MERF's successors read its generator settings; no run reads PE's, nor its own listing key
    assert set(hp) == {"delta", "n_samples", "dp_hp", "dp_merf"} and "epsilons" not in hp["dp_hp"]
    assert hp["dp_merf"] == h.config["baselines"]["dp_merf"] and hp["dp_hp"]["order"] == 10
    pe = json.loads(Wiring(h).params(SimpleNamespace(run="pe_eps1_seed0")))["baselines"]
    assert set(pe) == {"delta", "n_samples", "pe"}

    def retune(cfg):
        cfg["baselines"]["dp_ntk"] = {"width": 50}
        cfg["baselines"]["dp_hp"]["epsilons"] = [1, 3]
    for run in ("pe_eps1_seed0", "dp_merf_eps1_seed0", "dp_hp_eps1_seed0"):
        assert Wiring(house(tmp_path, retune)).params(SimpleNamespace(run=run)) == \
            Wiring(h).params(SimpleNamespace(run=run))


def test_a_successor_reads_the_private_and_public_splits_and_dp_mepf_also_the_public_clip(tmp_path):
    bl, data = Wiring(house(tmp_path)), tmp_path / "r" / "digits" / "data"
    splits = {"data": data / "private_train.npz", "public": data / "public.npz"}
    assert bl.embedding_inputs(SimpleNamespace(run="dp_hp_eps1_seed0")) == splits
    assert bl.embedding_inputs(SimpleNamespace(run="dp_mepf_eps1_seed0")) == {
        **splits, "clip": tmp_path / "r" / "digits" / "clip" / "clip.pt"}


def test_a_successors_line_stage_benchmark_and_bundle(tmp_path):
    bl, exp = Wiring(house(tmp_path)), tmp_path / "r" / "digits"
    assert bl.transcripts()[bl.ledger_path("dp_ntk_eps1_seed0")].stage == "dp_ntk"
    assert bl.stage(SimpleNamespace(run="dp_ntk_eps1_seed0")) == "dp_ntk"  # the stage rule embedding_baseline calls
    rec = next(r for r in bl.records() if r.config == "dp_mepf_eps1_seed0")
    assert rec.label == "DP-MEPF" and [Path(p) for p in rec.benchmarks][0] == \
        exp / "benchmarks" / "embedding_baseline" / "dp_mepf_eps1_seed0.tsv"
    b = bl.bundle("dp_mepf_eps1_seed0")
    assert b.kind == "model" and b.model == str(bl.generator_path("dp_mepf_eps1_seed0"))
    assert b.sampling["stream"] == "dp_mepf.generator" and "perceptual" in b.covers[0]
    assert any("CLIP" in c for c in b.not_covered)


# ---------------------------------------------------------------------------------------------- DP-Diffusion


def test_dp_diffusion_fine_tunes_the_public_denoiser_on_the_private_split(tmp_path):
    bl, exp = Wiring(house(tmp_path)), tmp_path / "r" / "digits"
    assert bl.dpsgd_inputs(SimpleNamespace(run="dp_diffusion_eps1_seed0")) == {
        "data": exp / "data" / "private_train.npz", "init": exp / "models" / "public_edm.pt"}
    assert bl.denoiser_path("dp_diffusion_eps1_seed0") == exp / "models" / "baselines" / "dp_diffusion_eps1_seed0.pt"


def test_dp_diffusions_training_params_are_its_subsection_with_views_on_the_public_denoisers_architecture(tmp_path):
    h = house(tmp_path)
    p = json.loads(Wiring(h).dpsgd_params(SimpleNamespace(run="dp_diffusion_eps1_seed0")))
    own, pretrain = h.config["baselines"]["dp_diffusion"], h.config["pretrain"]
    assert (p["epsilon"], p["seed"], p["delta"], p["parameterisation"]) == (1.0, 0, 1e-5, "edm")
    assert (p["K"], p["clip"], p["batch_size"], p["epochs"], p["lr"]) == (own["K"], own["clip"], own["batch_size"],
                                                                          own["epochs"], own["lr"])
    assert p["augment"] == {"max_shift": own["max_shift"], "flip": own["flip"]} and p["trainable"] is None
    # every tensor of the public denoiser is copied: its own architecture and conditioning, pretrain's label dropout
    assert (p["unet"], p["label_dropout"]) == ("init", pretrain["label_dropout"]) and "class_conditional" not in p
    from pipeline.training import UNET_FROM_INIT
    assert p["unet"] == UNET_FROM_INIT
    assert p["ledger_binding"] == {"run": "dp_diffusion_eps1_seed0", "experiment": "digits"}
    assert p["private"] == {"N": 2500, "n_classes": 10}
    from pipeline.training.dp_denoiser import DPDenoiserConfig
    cfg = DPDenoiserConfig.from_params(p)  # the stage accepts them
    assert cfg.augmentation().max_shift == own["max_shift"]

    def retune_others(cfg):
        cfg["baselines"]["dp_merf"]["steps"] = 7
        cfg["dpdm"]["K"] = 9
    assert Wiring(house(tmp_path, retune_others)).dpsgd_params(SimpleNamespace(run="dp_diffusion_eps1_seed0")) == \
        Wiring(h).dpsgd_params(SimpleNamespace(run="dp_diffusion_eps1_seed0"))
    # and tuning it reruns no other baseline
    def retune(cfg):
        cfg["baselines"]["dp_diffusion"]["K"] = 8
    assert Wiring(house(tmp_path, retune)).params(SimpleNamespace(run="dp_merf_eps1_seed0")) == \
        Wiring(h).params(SimpleNamespace(run="dp_merf_eps1_seed0"))


def test_dp_diffusion_samples_with_its_sampler_and_the_runs_seed(tmp_path):
    h = house(tmp_path)
    s = json.loads(Wiring(h).dpsgd_sample_params(SimpleNamespace(run="dp_diffusion_eps1_seed0")))
    n = h.config["baselines"]["n_samples"]
    assert s["sampler"] == h.config["baselines"]["dp_diffusion"]["sampler"] and s["n_samples"] == n
    assert (s["seed"], s["name"]) == (0, "baselines/dp_diffusion_eps1_seed0")


def test_dp_diffusions_line_is_train_dpdms_and_its_bundle_ships_the_denoiser(tmp_path):
    bl, exp = Wiring(house(tmp_path)), tmp_path / "r" / "digits"
    run = "dp_diffusion_eps1_seed0"
    assert bl.transcripts()[bl.ledger_path(run)].stage == "train_dpdm"
    rec = next(r for r in bl.records() if r.config == run)
    assert rec.label == "DP-Diffusion" and rec.method == "dp_diffusion" and [Path(p) for p in rec.benchmarks] == [
        exp / "benchmarks" / d / f"{run}.tsv" for d in ("dpsgd_baseline", "sample_baseline", "evaluate_baseline")]
    b = bl.bundle(run)
    assert b.kind == "model" and b.model == str(bl.denoiser_path(run))
    assert b.sampling["sampler"] == "dpdm" and b.sampling["settings"] == bl.section["dp_diffusion"]["sampler"]
    assert "augmented views" in b.covers[0] and any("public pretraining" in c for c in b.not_covered)


# ---------------------------------------------------------------------------------------------- PrivImage


def test_privimage_queries_the_private_split_then_pretrains_and_fine_tunes_its_own_denoiser(tmp_path):
    bl, exp = Wiring(house(tmp_path)), tmp_path / "r" / "digits"
    run, w = "privimage_eps1_seed0", SimpleNamespace(run="privimage_eps1_seed0")
    data = exp / "data"
    # the public pool: the public split and the second public domain (printed letters)
    assert bl.pool_inputs() == {"public": data / "public.npz", "other": data / "straightdp_public.npz"}
    assert bl.select_inputs(w) == {"data": data / "private_train.npz", "query_net": bl.query_net_path,
                                   "public": data / "public.npz", "other": data / "straightdp_public.npz"}
    # DP-SGD starts from the run's own pretrained denoiser; the query's transcript is composed into its calibration
    assert bl.dpsgd_inputs(w) == {"data": data / "private_train.npz", "init": bl.pretrained_path(run),
                                  "prior": bl.query_ledger_path(run)}
    assert bl.query_ledger_path(run) == exp / "ledger" / f"baselines_{run}_query.jsonl"

    def one_domain(cfg):
        cfg["baselines"]["privimage"]["second_domain"] = False
    assert "other" not in Wiring(house(tmp_path, one_domain)).pool_inputs()


def test_privimages_query_params_carry_only_the_query_so_retuning_its_dp_sgd_reruns_no_query(tmp_path):
    h = house(tmp_path)
    w = SimpleNamespace(run="privimage_eps1_seed0")
    q = json.loads(Wiring(h).select_params(w))
    own = h.config["baselines"]["privimage"]
    assert q["baselines"] == {"delta": 1e-5, "privimage": {k: own[k] for k in ("k", "query_share", "second_domain")}}
    assert q["run"] == "privimage_eps1_seed0" and q["private"] == {"N": 2500, "n_classes": 10}
    assert q["ledger_binding"] == {"run": "privimage_eps1_seed0", "experiment": "digits"}

    def retune(cfg):
        cfg["baselines"]["privimage"]["lr"] = 0.5
        cfg["baselines"]["privimage"]["K"] = 9
    assert Wiring(house(tmp_path, retune)).select_params(w) == Wiring(h).select_params(w)
    assert Wiring(house(tmp_path, retune)).dpsgd_params(w) != Wiring(h).dpsgd_params(w)


def test_privimage_fine_tunes_with_noise_multiplicity_and_no_views(tmp_path):
    h = house(tmp_path)
    p = json.loads(Wiring(h).dpsgd_params(SimpleNamespace(run="privimage_eps1_seed0")))
    own = h.config["baselines"]["privimage"]
    assert p["augment"] is None and p["K"] == own["K"] and p["unet"] == "init" and p["epsilon"] == 1.0
    from pipeline.training.dp_denoiser import DPDenoiserConfig
    assert DPDenoiserConfig.from_params(p).augmentation() is None


def test_privimage_pretrains_with_the_pretrain_recipe_and_its_own_steps(tmp_path):
    h = house(tmp_path)
    w = SimpleNamespace(run="privimage_eps1_seed2")
    p = json.loads(Wiring(h).pretrain_params(w))
    # the quick tour's own steps (300); the network and the rest of the recipe are pretrain's
    assert p["seed"] == 2 and p["pretrain"]["steps"] == h.config["baselines"]["privimage"]["pretrain_steps"] == 300
    assert p["pretrain"]["unet"] == h.config["pretrain"]["unet"] and p["pretrain"]["lr"] == h.config["pretrain"]["lr"]

    def unset(cfg):
        cfg["baselines"]["privimage"]["pretrain_steps"] = None
    assert json.loads(Wiring(house(tmp_path, unset)).pretrain_params(w))["pretrain"]["steps"] == \
        h.config["pretrain"]["steps"]


def test_privimages_files_are_its_runs_own_and_its_query_net_is_shared(tmp_path):
    bl, exp = Wiring(house(tmp_path)), tmp_path / "r" / "digits"
    run = "privimage_eps1_seed0"
    assert bl.query_net_path == exp / "models" / "baselines" / "privimage_query_net.pt"
    assert bl.query_net_metrics_path == exp / "train" / "baselines" / "privimage_query_net.json"
    assert bl.selected_path(run) == exp / "public" / "baselines" / f"{run}.npz"
    assert bl.query_metrics_path(run) == exp / "train" / "baselines" / f"{run}_query.json"
    assert bl.pretrained_path(run) == exp / "models" / "baselines" / f"{run}_public.pt"
    assert bl.pretrain_metrics_path(run) == exp / "train" / "baselines" / f"{run}_public.json"
    # the query net: public data only, the configuration's seed; its settings and nothing of any run
    p = json.loads(bl.query_net_params())
    assert p["baselines"] == {"privimage": {"query_net": bl.section["privimage"]["query_net"]}}
    assert p["seed"] == bl.house.config["seed"] and "run" not in p and "private" not in p


def test_privimage_runs_have_two_lines_composed_and_a_bundle_covering_both(tmp_path):
    bl, exp = Wiring(house(tmp_path)), tmp_path / "r" / "digits"
    run = "privimage_eps1_seed0"
    ts = bl.transcripts()
    assert ts[bl.query_ledger_path(run)].stage == "privimage_select" and ts[bl.ledger_path(run)].stage == "train_dpdm"
    rec = next(r for r in bl.records() if r.config == run)
    # the query first: the run's composition certifies under the last (DP-SGD) line's accountant
    assert [Path(p) for p in rec.ledgers] == [bl.query_ledger_path(run), bl.ledger_path(run)]
    assert rec.label == "PrivImage" and [Path(p) for p in rec.benchmarks] == [
        exp / "benchmarks" / d / f"{run}.tsv" for d in ("privimage_select", "privimage_pretrain", "dpsgd_baseline",
                                                         "sample_baseline", "evaluate_baseline")]
    b = bl.bundle(run)
    assert [Path(t) for t in b.transcripts] == [bl.query_ledger_path(run), bl.ledger_path(run)]
    assert "semantic query" in b.covers[0] and "diffusion draws" in b.covers[1]


# ---------------------------------------------------------------------------------------------- DP-LDM


def test_dp_ldm_encodes_with_a_public_autoencoder_and_fine_tunes_a_latent_denoiser_on_the_private_codes(tmp_path):
    bl, exp = Wiring(house(tmp_path)), tmp_path / "r" / "digits"
    run, w = "dp_ldm_eps1_seed0", SimpleNamespace(run="dp_ldm_eps1_seed0")
    # one autoencoder and one latent denoiser per configuration, both from public data
    assert bl.ldm_autoencoder_path == exp / "models" / "baselines" / "dp_ldm_autoencoder.pt"
    assert bl.ldm_denoiser_path == exp / "models" / "baselines" / "dp_ldm_public.pt"
    assert bl.ldm_code_source(SimpleNamespace(name="public")) == exp / "data" / "public.npz"
    assert bl.ldm_code_source(SimpleNamespace(name="private_train")) == exp / "data" / "private_train.npz"
    codes = exp / "latent" / "baselines" / "dp_ldm" / "private_train_codes.npz"
    assert bl.ldm_codes_path("private_train") == codes and bl.ldm_dir == codes.parent
    assert bl.ldm_autoencoder_metrics_path == exp / "train" / "baselines" / "dp_ldm_autoencoder.json"
    assert bl.ldm_denoiser_metrics_path == exp / "train" / "baselines" / "dp_ldm_public.json"
    # the file its mechanism reads (its line's binding): the private codes; the pixel baselines' the private split
    assert bl.private_data(BaselineRun.from_name(run)) == codes
    assert bl.private_data(BaselineRun.from_name("privimage_eps1_seed0")) == exp / "data" / "private_train.npz"
    # DP-SGD reads the private codes and starts from the latent denoiser; its samples are codes, then decoded
    assert bl.dpsgd_inputs(w) == {"data": codes, "init": bl.ldm_denoiser_path}
    assert bl.latent_samples_path(run) == exp / "samples" / "baselines" / "latent" / f"{run}.npz"
    assert bl.latent_manifest_path(run).suffix == ".json"


def test_dp_ldm_fine_tunes_only_its_attention_and_class_embedding(tmp_path):
    h = house(tmp_path)
    p = json.loads(Wiring(h).dpsgd_params(SimpleNamespace(run="dp_ldm_eps1_seed0")))
    own = h.config["baselines"]["dp_ldm"]
    assert p["trainable"] == own["trainable"] == ["*attentions*", "unet.class_embedding.*"]
    assert p["augment"] is None and p["K"] == own["K"] and p["unet"] == "init" and p["epsilon"] == 1.0
    from pipeline.training.dp_denoiser import DPDenoiserConfig
    assert DPDenoiserConfig.from_params(p).trainable == tuple(own["trainable"])
    # the other DP-SGD baselines fine-tune every weight
    assert json.loads(Wiring(h).dpsgd_params(SimpleNamespace(run="privimage_eps1_seed0")))["trainable"] is None


def test_dp_ldms_public_stages_read_only_its_subsection_and_the_pretrain_recipe(tmp_path):
    h = house(tmp_path)
    bl, own = Wiring(h), h.config["baselines"]["dp_ldm"]
    ae = json.loads(bl.ldm_autoencoder_params())
    assert ae["autoencoder"] == own["autoencoder"] and ae["seed"] == h.config["seed"] and "private" not in ae
    pre = json.loads(bl.ldm_pretrain_params())
    # the latent unet is DP-LDM's own; the loss and optimiser are pretrain's
    assert pre["pretrain"]["unet"] == own["unet"] != h.config["pretrain"]["unet"]
    assert pre["pretrain"]["lr"] == h.config["pretrain"]["lr"] and pre["pretrain"]["steps"] == (
        own["pretrain_steps"] or h.config["pretrain"]["steps"])
    assert "source" not in pre["pretrain"] and "run" not in pre
    assert json.loads(bl.ldm_codes_params(SimpleNamespace(name="public")))["name"] == "dp_ldm_public_codes"
    assert json.loads(bl.ldm_decode_params(SimpleNamespace(run="dp_ldm_eps1_seed0")))["name"] == \
        "baselines/dp_ldm_eps1_seed0"

    def retune(cfg):
        cfg["baselines"]["dp_ldm"]["K"] = 9
        cfg["baselines"]["dp_ldm"]["trainable"] = ["*"]
    # retuning its DP-SGD retrains no autoencoder and no latent denoiser
    assert Wiring(house(tmp_path, retune)).ldm_autoencoder_params() == bl.ldm_autoencoder_params()
    assert Wiring(house(tmp_path, retune)).ldm_pretrain_params() == bl.ldm_pretrain_params()


def test_every_rule_asks_for_its_request_in_the_baselines_cost_model_and_reuses_the_engines_it_runs(tmp_path):
    from pipeline import resources as cost
    from pipeline.methods.dpdm import costs as dpdm_costs

    h = house(tmp_path)
    bl = Wiring(h)
    requests = check_requests(bl, "baselines.smk", costs.REQUESTS)
    cfg = h.config
    assert bl.resources("dp_merf")["runtime"] == costs.run_runtime_min(cfg) >= 10
    # the DP-SGD baselines run DPDM's engine, PrivImage and DP-LDM the public pretraining: their costs
    dpsgd = requests["dpsgd_baseline"]
    assert (dpsgd["gpu"], dpsgd["mem_mb"], dpsgd["runtime"]) == (1, dpdm_costs.train_mem_mb(cfg),
                                                                   dpdm_costs.train_runtime_min(cfg))
    # each run's GPU memory: the DP-SGD engine's plan of its own denoiser at its section's micro-batch and K
    for run, method in (("dp_diffusion_eps1_seed0", "dp_diffusion"), ("dp_ldm_eps1_seed0", "dp_ldm")):
        own = h.config["baselines"][method]
        plan = cost.dpsgd_memory(bl.dpsgd_network(method), own["micro_batch"], own["K"])
        assert dpsgd["gpu_mem_mb"](SimpleNamespace(run=run)) == plan.predicted_mb
    # DP-LDM's denoiser is its latent UNet on the codes, the others the public denoiser's architecture
    assert bl.ldm_code_shape[1] == bl.dpsgd_network("dp_ldm")["unet"]["image_size"] == cost.image_side(cfg) // 4
    assert bl.dpsgd_network("dp_diffusion") == cost.pretrain_network(cfg)
    phase1 = requests["dp_promise_phase1"]["gpu_mem_mb"](SimpleNamespace(run="dp_promise_eps1_seed0"))
    assert phase1 == bl.dpsgd_memory("dp_promise_eps1_seed0").predicted_mb
    assert requests["sample_baseline"]["runtime"] == dpdm_costs.sample_runtime_min(cfg)
    assert requests["privimage_pretrain"]["runtime"] == cost.segment_runtime_min(cfg, cost.pretrain_runtime_min(cfg))
    assert requests["dp_ldm_pretrain"]["gpu_mem_mb"](SimpleNamespace()) == bl.ldm_pretrain_memory.predicted_mb


def test_dp_ldms_latent_denoiser_is_sized_for_the_gpu_on_its_codes_not_the_images(tmp_path):
    from pipeline import resources as cost

    h = house(tmp_path)
    bl, own = Wiring(h), h.config["baselines"]["dp_ldm"]
    plan = bl.ldm_pretrain_memory
    codes = cost.pretrain_network(h.config, own["unet"], (own["autoencoder"]["code_channels"], 16 // 4))
    assert plan == cost.memory_plan(h.config, "dp_ldm_pretrain", codes, h.config["pretrain"]["batch_size"])
    assert plan.micro_batch == plan.batch  # the embedded codes fit: no batch_gpu in the params
    assert "batch_gpu" not in json.loads(bl.ldm_pretrain_params())
    # on a GPU too small for the batch (1.69 GB leaves ~6 MB after the reserve and the training state), the stage is
    # told its micro-batch
    small = Wiring(house(tmp_path, lambda cfg: cfg.setdefault("slurm", {}).update(gpu_mem_gb=1.69)))
    assert 1 <= small.ldm_pretrain_memory.micro_batch < small.ldm_pretrain_memory.batch
    assert json.loads(small.ldm_pretrain_params())["batch_gpu"] == small.ldm_pretrain_memory.micro_batch


def test_dp_ldms_line_binds_the_private_codes_and_its_bundle_is_the_decoded_synthetic_set(tmp_path):
    bl, exp = Wiring(house(tmp_path)), tmp_path / "r" / "digits"
    run = "dp_ldm_eps1_seed0"
    spec = bl.transcripts()[bl.ledger_path(run)]
    assert spec.stage == "train_dpdm" and spec.data == str(bl.ldm_codes_path("private_train"))
    rec = next(r for r in bl.records() if r.config == run)
    assert rec.label == "DP-LDM" and [Path(p) for p in rec.ledgers] == [bl.ledger_path(run)]
    assert [Path(p) for p in rec.benchmarks] == [
        exp / "benchmarks" / d / f"{run}.tsv" for d in ("dpsgd_baseline", "sample_dp_ldm", "dp_ldm_decode",
                                                         "evaluate_baseline")]
    # the rules between a DP-SGD baseline's denoiser and its samples; none for a method whose stage samples
    assert Wiring.sample_rules("dp_ldm") == ("sample_dp_ldm", "dp_ldm_decode")
    assert Wiring.sample_rules("privimage") == ("sample_baseline",) and Wiring.sample_rules("pe") == ()
    b = bl.bundle(run)
    assert b.kind == "synthetic" and b.model is None and b.sampling is None
    assert "attention" in b.covers[0] and "codes" in b.covers[0]
    assert any("autoencoder" in c for c in b.not_covered)


# ---------------------------------------------------------------------------------------------- DP-Promise


def test_dp_promise_runs_phase_one_on_high_noise_levels_then_phase_two_from_it_on_low_ones(tmp_path):
    h = house(tmp_path)
    bl, exp = Wiring(h), tmp_path / "r" / "digits"
    run, w = "dp_promise_eps1_seed0", SimpleNamespace(run="dp_promise_eps1_seed0")
    own = h.config["baselines"]["dp_promise"]
    assert bl.phase1_inputs(w) == {"data": exp / "data" / "private_train.npz", "init": exp / "models" / "public_edm.pt"}
    assert bl.phase1_path(run) == exp / "models" / "baselines" / f"{run}_phase1.pt"
    assert bl.phase1_metrics_path(run) == exp / "train" / "baselines" / f"{run}_phase1.json"
    one = json.loads(bl.phase1_params(w))
    assert one["sigma_range"] == [own["sigma_split"], None] and one["epsilon"] == own["phase1_share"] * 1.0
    # phase II starts from phase I's private model, composes its transcript, and trains the complementary levels
    assert bl.dpsgd_inputs(w) == {"data": exp / "data" / "private_train.npz", "init": bl.phase1_path(run),
                                  "prior": bl.phase1_ledger_path(run)}
    two = json.loads(bl.dpsgd_params(w))
    assert two["sigma_range"] == [0.0, own["sigma_split"]] and two["epsilon"] == 1.0
    # the two releases of one run by one stage: each line names its phase (its identity in the replay)
    assert (one["ledger_binding"]["phase"], two["ledger_binding"]["phase"]) == ("phase1", "phase2")
    differ = ("sigma_range", "epsilon", "config_id", "ledger_binding")
    assert {k: v for k, v in one.items() if k not in differ} == {k: v for k, v in two.items() if k not in differ}
    from pipeline.training.dp_denoiser import DPDenoiserConfig
    assert DPDenoiserConfig.from_params(one).sigma_range == (own["sigma_split"], None)
    # the other DP-SGD baselines draw every noise level
    assert "sigma_range" not in json.loads(bl.dpsgd_params(SimpleNamespace(run="dp_diffusion_eps1_seed0")))


def test_dp_promises_row_composes_both_phases_and_its_bundle_says_what_is_not_counted(tmp_path):
    bl, exp = Wiring(house(tmp_path)), tmp_path / "r" / "digits"
    run = "dp_promise_eps1_seed0"
    ts = bl.transcripts()
    one, two = ts[bl.phase1_ledger_path(run)], ts[bl.ledger_path(run)]
    assert one.stage == two.stage == "train_dpdm"
    assert one.data == str(exp / "data" / "private_train.npz")
    # distinct identities, the same configured DP-SGD; phase I calibrated to its share alone, phase II to eps with
    # phase I composed before it
    assert (one.phase, two.phase) == ("phase1", "phase2") and one.params == two.params
    own = bl.section["dp_promise"]
    assert (one.epsilon_target, one.after) == ((own["phase1_share"],), ())
    assert (two.epsilon_target, two.after) == ((1.0,), (str(bl.phase1_ledger_path(run)),))
    rec = next(r for r in bl.records() if r.config == run)
    assert rec.label == "DP-Promise (certified variant)"
    assert [Path(p) for p in rec.ledgers] == [bl.phase1_ledger_path(run), bl.ledger_path(run)]
    assert [Path(p) for p in rec.benchmarks] == [
        exp / "benchmarks" / d / f"{run}.tsv" for d in ("dp_promise_phase1", "dpsgd_baseline", "sample_baseline",
                                                         "evaluate_baseline")]
    b = bl.bundle(run)
    assert b.kind == "model" and [Path(t) for t in b.transcripts] == [bl.phase1_ledger_path(run), bl.ledger_path(run)]
    assert "phase I" in b.covers[0] and "forward process's noise is not counted" in b.covers[0]
    assert "phase II" in b.covers[1]
