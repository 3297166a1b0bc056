"""The Snakemake workflow: lint-clean, dry-runs under both profiles, one-line config errors,
and the embedded default DAG end to end at a tiny size (the slow tier: ``make test-slow``)."""

from __future__ import annotations

import hashlib
import os
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from pipeline.config import deep_merge
from pipeline.data.layout import idx_names
from pipeline.io import CorruptFileError, load_split
from pipeline.models.checkpoint import read_denoiser_meta
from pipeline.training.public import folder_sha256
from pipeline.reporting.tables import unmeasured_columns
from pipeline.methods.straightdp.runs import ROWS
from tests.conftest import planned_jobs
from tests.public_models import save_label_tables, save_sd3, save_unet

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

# every test here starts Snakemake (seconds to parse the DAG, minutes for the tiny run): the slow tier
pytestmark = pytest.mark.slow


def snakemake(repo: Path, *args: str,  # targets before --configfile: it takes several values
              env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    run_env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **(env or {})}
    return subprocess.run([SNAKEMAKE, *args], cwd=repo, capture_output=True, text=True, env=run_env, timeout=timeout)


def test_lint_is_clean(repo):
    res = snakemake(repo, "--lint")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Congratulations, your workflow is in a good condition" in res.stdout + res.stderr


@pytest.mark.parametrize("how", [("--cores", "2"), ("--profile", "profiles/local")])
def test_dry_run_local(repo, tmp_path, how):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"results_dir": str(tmp_path / "results")}))
    res = snakemake(repo, "-n", *how, "all", "--configfile", str(cfg))
    assert res.returncode == 0, res.stderr
    assert "prepare_data" in res.stdout and "train_evalnet" in res.stdout


def _gpu_rules(stdout: str) -> dict[str, str]:
    """Each rule that asks for GPUs: its (last) resources line of the dry run."""
    rules, current = {}, None
    for line in stdout.splitlines():
        if line.startswith(("rule ", "localrule ")):
            current = line.split()[1].rstrip(":")
        elif line.strip().startswith("resources:") and current:
            rules[current] = line
    return {r: res for r, res in rules.items() if re.search(r"\bgpu=[1-9]", res)}


def test_dry_run_slurm_profile_requests_gpus(repo, tmp_path):
    """GPU jobs go to the GPU partition; with EMPDEN's cells sharded (sampling.shards: 3, batches of 100 of the
    quick tour's 250 outputs), each cell is three sampling and three feature jobs on GPUs and a CPU gather; with
    dpdm.gpus 2 a DPDM training job asks for two GPUs in one task and runs its stage as two processes."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"results_dir": str(tmp_path / "results"), "sampling": {"shards": 3},
                                   "empden": {"batch_size": 100}, "dpdm": {"gpus": 2}}))
    res = snakemake(repo, "-n", "--profile", "profiles/slurm", "all", "--configfile", str(cfg),
                    env={"DPGEN_SLURM_PARTITION": "gpu_part"})
    assert res.returncode == 0, res.stderr
    gpu = _gpu_rules(res.stdout)
    assert "train_evalnet" in gpu and "evaluate_reference_real" in gpu
    assert all("slurm_partition=gpu_part" in line for line in gpu.values())
    jobs = planned_jobs(res.stdout)
    cells = jobs["empden_evaluate"]
    assert jobs["empden_gather"] + jobs["empden_gather_public_only"] == cells
    assert jobs["empden_features"] == 3 * cells
    assert sum(jobs[f"empden_sample_{m}"] for m in ("subsampled", "full_batch", "public_only")) == 3 * cells
    assert "empden_features" in gpu and "empden_sample_subsampled" in gpu and "empden_gather" not in gpu
    assert "gpu=2" in gpu["train_dpdm"] and "tasks=1" in gpu["train_dpdm"] and "gpu=1" in gpu["train_straightdp"]
    assert "python -m pipeline --nproc 2 train_dpdm " in res.stdout


def test_profile_by_name_after_make_slurm_profile(repo, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    subprocess.run(["make", "-s", "slurm-profile", f"HOME={home}"], cwd=repo, check=True, capture_output=True)
    assert (home / ".config" / "snakemake" / "slurm" / "config.yaml").is_file()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"results_dir": str(tmp_path / "results")}))
    res = snakemake(repo, "-n", "--profile", "slurm", "all", "--configfile", str(cfg), env={"HOME": str(home)})
    assert res.returncode == 0, res.stderr
    assert "train_evalnet" in _gpu_rules(res.stdout)


def test_bad_config_is_one_line(repo, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("data:\n  private:\n    n_tset: 100\n")
    res = snakemake(repo, "-n", "--cores", "1", "--configfile", str(cfg))
    assert res.returncode != 0
    errors = [l for l in (res.stdout + res.stderr).splitlines() if "config error" in l]
    assert errors == ["config error at data.private.n_tset: unknown key (did you mean 'n_test'?)"]
    assert "Traceback" not in res.stderr


TINY = {
    "experiment": "tiny",
    "data": {
        "image_size": 12,
        "private": {"n_private_train": 100, "n_eval_train": 300, "n_reference": 100, "n_test": 200},
        "public": {"n": 100},
        "toy": {"n": 200},
    },
    "accounting": {"p": [55], "B": [25], "N_out": 50, "asr_q": [0.01], "asr_N": 40},
    # SENSGEO's six stages have their own stage tests (tests/methods/sensgeo/test_tables.py);
    # leaving them out here keeps the suite under 5 minutes on 2 cores
    "methods": ["accounting", "empden", "empden_diagnostics", "dpdm", "straightdp", "baselines", "audit"],
    "audit": {"canaries": 50,
              # the twin and the attacks at a toy size: a few passes, few draws, a short inversion
              "mia": {"twin_epochs": 20, "loss_draws": 2, "secmi_inversion_steps": 10, "bootstrap": 50}},
    "evaluation": {
        "batch_size": 100,
        "kid_subset_size": 50,
        "evalnet": {"epochs": 3, "width": 8},
        "downstream": {"cnn_epochs": 2, "mlp_hidden": 32, "repeats": 2},
        "clip": {"steps": 20, "groups": 2, "width": 16, "layers": 1, "embed_dim": 8},
    },
    # every method at a toy size: one cell each, a few optimisation steps
    "pretrain": {"steps": 4, "batch_size": 16, "unet": {"block_out_channels": [8, 16]}},
    "empden": {"n_out": 20, "grid": [{"p": [55], "B": [25], "T": [3]}], "beta_ablation": None,
               "repeated_seeds": None, "figure2": None, "full_batch": {"sigma_min": [0.5]}},
    "empden_diagnostics": {"n_trajectories": 4, "batch_size": 4, "proxy_seeds": 1, "bootstrap_resamples": 100},
    "dpdm": {"epsilons": [10], "batch_size": 50, "epochs": 0.05, "K": 2, "micro_batch": 25,
             "unet": {"block_out_channels": [8, 16]},
             "sampling": {"n_samples": 20, "batch_size": 20, "per_class": 1},
             "noise_multiplicity": None, "parameterisation_ablation": None,
             # the task-specific DP-SGD classifier (2 steps) and Fig. 3 (two K, one image) at a toy size
             "dpsgd_classifier": {"batch_size": 50, "epochs": 1, "micro_batch": 50},
             "gradient_variance": {"K": [1, 2], "repeats": 4, "n_images": 1, "bootstrap": 20},
             # two samplers: the main one is chosen on val (checkpoint dpdm_select_sampler)
             "sampler_ablation": {"epsilons": [10], "samplers": ["ddim", "guided"]}},
    # every Table 1 row at one eps and seed: a one-block MM-DiT, two steps of each training
    "straightdp": {"epsilons": [1], "seeds": [0], "public": {"n": 100},
                   "rows": list(ROWS),  # every row (config.yaml's quick tour leaves one out)
                   "flow": {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8,
                            "joint_attention_dim": 8, "caption_tokens": 2},
                   "pretrain": {"steps": 4, "batch_size": 16}, "release": {"p": 8, "rank": 4},
                   "horizon": {"n_times": 4, "n_probe": 8}, "distill": {"steps": 2, "batch_size": 16},
                   "dpsgd": {"steps": 2, "batch_size": 25, "micro_batch": 25, "proxy_examples": 4, "buckets": 2,
                             "betas": [0, 1]},
                   "sampling": {"n_samples": 20, "batch_size": 20, "steps": 2},
                   # Fig. 6's toy at one point per line
                   "toy": {"epsilons": [1], "seeds": [0], "hidden": 8, "pretrain_steps": 10, "distill_steps": 2,
                           "dpsgd_steps": 2, "dpsgd_batch_size": 40, "n_eval": 20},
                   # Table 4 at one point per featurisation
                   "table4": {"epsilons": [1], "seeds": [0], "n_samples": 80},
                   # Table 1's latent block and Table 2's constrained arm at the main grid's one point
                   "arms": {"latent": {"space": "latent", "autoencoder": {"steps": 5, "width": 8},
                                       "flow": {"patch_size": 1},  # 12 x 12 images: 3 x 3 codes
                                       "rows": ["uniform_moments"], "epsilons": [1], "seeds": [0],
                                       "tables": ["table1_main"]},
                            "low_b0": {"flow": {"stream_clamp": 16, "late_injection": 1, "decoupled_attention": True},
                                       "rows": ["uniform_moments"], "epsilons": [1], "seeds": [0],
                                       "tables": ["table1_main", "table2_noise_sweep", "table2_ablation"]}}},
    # every baseline at one eps: a few generator steps (DP-MERF's, shared by its successors), two PE iterations of
    # two candidates per class
    "baselines": {"epsilons": [3], "n_samples": 20,
                  "dp_merf": {"n_features": 64, "steps": 5, "batch_size": 20, "hidden": 16},
                  "dp_hp": {"epsilons": None, "order": 4, "n_pairs": 10}, "dp_ntk": {"epsilons": None, "width": 16},
                  "dp_mepf": {"epsilons": None},
                  # DP-Diffusion: one DP-SGD step of the (imported) public denoiser on two views per example
                  "dp_diffusion": {"epsilons": None, "K": 2, "batch_size": 50, "epochs": 0.05, "micro_batch": 25,
                                   "sampler": {"name": "ddim", "steps": 2}},
                  # PrivImage: a one-epoch query net over the digits and letters, 4 pretraining steps on what the
                  # query chose, then DP-Diffusion's one DP-SGD step (noise multiplicity alone)
                  "privimage": {"epsilons": None, "K": 2, "batch_size": 50, "epochs": 0.05, "micro_batch": 25,
                                "sampler": {"name": "ddim", "steps": 2}, "pretrain_steps": 4,
                                "query_net": {"width": 4, "feature_dim": 8, "epochs": 1, "batch_size": 64}},
                  # DP-LDM: a 20-step autoencoder (4 x 3 x 3 codes: one UNet level), 4 latent pretraining steps,
                  # one DP-SGD step of its attention and class embedding
                  "dp_ldm": {"epsilons": None, "K": 2, "batch_size": 50, "epochs": 0.05, "micro_batch": 25,
                             "sampler": {"name": "ddim", "steps": 2}, "pretrain_steps": 4,
                             "autoencoder": {"code_channels": 4, "width": 8, "steps": 20, "batch_size": 64,
                                             "lr": 2.0e-3},
                             "unet": {"block_out_channels": [8], "attention": [True], "layers_per_block": 1,
                                      "norm_num_groups": 4}},
                  # DP-Promise (certified variant): one DP-SGD step in each phase
                  "dp_promise": {"epsilons": None, "K": 2, "batch_size": 50, "epochs": 0.02, "micro_batch": 25,
                                 "sampler": {"name": "ddim", "steps": 2}},
                  "pe": {"iterations": 2, "n_per_class": 2, "sampler_steps": 3}},
}


#: edits of one method's config key -> (a rule the edit must replan, every rule it may replan: the
#: method's own, the replay, the summary and the report's table views that read every method's outputs,
#: and the target `all`)
RERUN_SCOPE = {
    "dpdm.seeds": ({"dpdm": {"seeds": [0, 1]}}, "train_dpdm",
                   {"train_dpdm", "sample_dpdm", "evaluate_dpdm", "dpdm_table_main", "dpdm_samples_by_epsilon",
                    "audit_one_run", "train_dpdm_twin", "audit_mia", "audit_mia_table",
                    # EMPDEN Table 2's prior-method rows read DPDM's main table
                    "empden_table2_comparison",
                    # the task-specific DP-SGD classifier runs at DPDM's seeds, beside DPDM's main table
                    "train_dpsgd_classifier", "dpdm_table_dpsgd_classifier"}),
    "empden.n_out": ({"empden": {"n_out": 10}}, "empden_sample_subsampled",
                     {"empden_sample_subsampled", "empden_sample_full_batch", "empden_sample_public_only",
                      "empden_evaluate", "empden_table8_grid", "empden_table2_comparison", "empden_figure3_tradeoffs",
                      "empden_figure4_samples",
                      # the one-run audit reruns every EMPDEN sampler line
                      "audit_one_run"}),
    # the accounting method's tables share one empden_blocks job; EMPDEN's sampled cells are untouched
    "accounting.asr_N": ({"accounting": {"asr_N": 60}}, "empden_table13_theoretical_asr",
                         {"empden_blocks", "empden_table7_accountants", "empden_table8_9_eps",
                          "empden_table11_edgeworth_clt_pld", "empden_table12_rdp", "empden_table13_theoretical_asr",
                          "empden_figure4_full_batch", "empden_figure5_mu_vs_logsnr",
                          "empden_figure7_stopping_traces",
                          # SecMI is read at Table 13's stopping points of the asr_N grid
                          "audit_mia", "audit_mia_table", "empden_table13"}),
    # a new seed trains its own runs; the runs already built are not replanned
    "straightdp.seeds": ({"straightdp": {"seeds": [0, 1]}}, "train_straightdp",
                         {"release_moments", "train_straightdp", "sample_straightdp", "evaluate_straightdp",
                          "straightdp_table", "straightdp_figure_accuracy", "audit_one_run", "audit_mia",
                          "audit_mia_table"}),
    # the audit reads every private mechanism's transcripts; the runs that wrote them are untouched
    "audit.canaries": ({"audit": {"canaries": 60}}, "audit_one_run", {"audit_one_run"}),
    "baselines.seeds": ({"baselines": {"seeds": [0, 1]}}, "private_evolution",
                        {"dp_merf", "embedding_baseline", "private_evolution", "dpsgd_baseline", "sample_baseline",
                         "privimage_select", "privimage_pretrain", "sample_dp_ldm", "dp_ldm_decode", "dp_promise_phase1",
                         "evaluate_baseline", "baselines_table", "empden_table2_comparison", "audit_one_run"}),
    "empden_diagnostics.bootstrap_resamples": ({"empden_diagnostics": {"bootstrap_resamples": 200}},
                                               "empden_table1_window_swap",
                                               {"empden_table1_window_swap", "empden_table4_proxy",
                                                "empden_figure6_critical_window"}),
}
SHARED_RULES = {"replay", "index_html", "all", "all_runs_table", "privacy_utility_figure", "runtime_table",
                "runtime_figure", "report_tables", "export_bundle"}


def check_bundles(repo: Path, results: Path, all_runs: pd.DataFrame) -> None:
    """Every private row of all_runs has its bundle (a DPDM run's samplers share one); a DPDM and a STRAIGHTDP bundle
    of weights verify from the command line and redraw their run's own samples."""
    # the task-specific DP-SGD classifier is a classifier, not a generator: it has no samples to bundle
    private = all_runs[all_runs["private"] & (all_runs["method"] != "dpsgd_classifier")]
    folder = {"dpdm": lambda c: c.split("/")[0], "empden": lambda c: c.replace("/", "_")}
    house = {m: "baselines" for m in ("dp_merf", "pe", "dp_hp", "dp_ntk", "dp_mepf", "dp_diffusion", "privimage",
                                      "dp_ldm", "dp_promise")}
    expected = {f"{house.get(m, m)}/{folder.get(m, str)(c)}" for m, c in zip(private["method"], private["config"])}
    found = {p.relative_to(results / "bundles").as_posix() for p in (results / "bundles").glob("*/*") if p.is_dir()}
    assert found == expected
    for method in ("dpdm", "straightdp"):
        certs = {p.parent: json.loads(p.read_text()) for p in (results / "bundles" / method).glob("*/certificate.json")}
        bundle, cert = next((b, c) for b, c in sorted(certs.items()) if c["kind"] == "model")
        res = subprocess.run([sys.executable, "-m", "pipeline", "verify_bundle", str(bundle)], cwd=repo,
                             capture_output=True, text=True)
        assert res.returncode == 0 and res.stdout.startswith("ok "), res.stderr
        own = np.load(bundle / "samples.npz", allow_pickle=False)
        n = json.loads((bundle / "sampling.json").read_text())["n_samples"]
        res = subprocess.run([sys.executable, "-m", "pipeline", "sample_bundle", str(bundle), "--n", str(n),
                              "--out", str(bundle.parent / "again.npz")], cwd=repo, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        again = np.load(bundle.parent / "again.npz", allow_pickle=False)
        assert np.array_equal(again["images"], own["images"]) and np.array_equal(again["labels"], own["labels"])
        for p in (bundle.parent / "again.npz", bundle.parent / "again.json"):
            p.unlink()


def check_report(page: str, results: Path, tmp_path: Path) -> None:
    """Snakemake's report of a finished run: the summary is its first page, every table (as its readable
    view) and every figure of `all` is in it with a caption, and headless Chromium renders it."""
    assert "One row per method" in page and "Privacy ledger replay" in page
    views = sorted((results / "report" / "tables").glob("*.html"))
    figures = sorted((results / "figures").glob("*.png"))
    assert len(views) >= 20 and len(figures) >= 15
    for path in views + figures:
        assert path.name in page, f"{path.name} missing from the report"
    assert "No caption has been written" not in page  # every result has its own caption
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("headless Chromium not installed (.ci/run installs Debian's chromium): screenshot not taken")
    shot = tmp_path / "report.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1400,1000", "--virtual-time-budget=10000", f"--screenshot={shot}",
                    (tmp_path / "report.html").as_uri()], capture_output=True, timeout=180, check=True)
    import matplotlib.image as mpimg

    pixels = mpimg.imread(shot)
    # a rendered page, not a blank one: the summary's text and the figure put many distinct greys on it
    assert pixels.shape[:2] == (1000, 1400) and pixels.std() > 0.05


def test_embedded_default_end_to_end_tiny(repo, tmp_path):
    # a results folder with a space: every path a rule hands to the shell is quoted
    results = tmp_path / "out dir"
    cfg = tmp_path / "tiny.yaml"
    # the public denoiser is a user's diffusers model (pretrain.source: diffusers; public pretraining itself runs in
    # the preset tier): a tiny random UNet2DModel saved by save_pretrained, at the data's 12 px and 10 classes + null
    public_model = tmp_path / "public unet"
    save_unet(public_model, sample_size=12, num_class_embeds=11, norm_num_groups=8)
    pretrain = {"source": "diffusers", "path": str(public_model)}
    # and STRAIGHTDP's public flow (Table 3's frozen-model route starts from it) a tiny random SD3Transformer2DModel
    # with caption/pooled tables for the 10 digits + the null caption (the arms still pretrain their own)
    save_sd3(tmp_path / "public sd3", sample_size=12, patch_size=2, pos_embed_max_size=6, num_layers=1,
             joint_attention_dim=8, pooled_projection_dim=8)
    save_label_tables(tmp_path / "labels.safetensors", n_classes=10, tokens=2, pooled_projection_dim=8)
    straightdp = deep_merge(TINY["straightdp"], {"pretrain": {
        "source": "diffusers", "path": str(tmp_path / "public sd3"),
        "label_embeddings": str(tmp_path / "labels.safetensors")}})
    cfg.write_text(yaml.safe_dump({**TINY, "results_dir": str(results), "pretrain": pretrain,
                                   "straightdp": straightdp}))
    # ~15 min on 2 cores beside the rest of the slow tier (every method at a toy size, ~130 jobs; make test-slow
    # runs two tests at once): the guard against a hang is wider, for a slower CI machine
    res = snakemake(repo, "--cores", "2", "all", "--configfile", str(cfg), timeout=2700)
    assert res.returncode == 0, res.stderr[-3000:]
    assert not (repo / "out").exists() and not (tmp_path / "out").exists()
    table = pd.read_parquet(results / "tables" / "reference_real.parquet")
    assert len(table) == 1 and {"fid", "config_id", "seed", "acc_cnn"} <= set(table.columns)
    # held-out real data against real test data: a well-trained classifier gets far above chance
    assert table["acc_logreg"].iloc[0] > 0.5
    for fig in ("data_samples.png", "data_samples.pdf"):
        assert (results / "figures" / fig).stat().st_size > 1000
    index = (results / "index.html").read_text()
    for name in ("reference_real", "empden_table8_grid", "empden_table4_proxy", "dpdm_table_main",
                 "straightdp_table1_main", "straightdp_table5_per_class"):
        assert (results / "report" / "tables" / f"{name}.html").stat().st_size > 500  # the report's view
        assert len(pd.read_parquet(results / "tables" / f"{name}.parquet")) >= 1
    # CLIP metrics beside the eval-net ones, in the shared evaluation and so in every method's table
    for name in ("reference_real", "dpdm_table_main", "straightdp_table1_main", "empden_table8_grid"):
        cols = set(pd.read_parquet(results / "tables" / f"{name}.parquet").columns)
        assert {"clip_fd", "clip_zero_shot_acc"} <= cols or {"clip_fd_mean", "clip_zero_shot_acc_mean"} <= cols, name
    # the hybrid cell and the DPDM run claimed their epsilon, and the replay recomputed every claim
    replay = json.loads((results / "tiny" / "ledger" / "replay.json").read_text())
    assert replay["all_ok"] and len(replay["claims"]) >= 3
    # STRAIGHTDP: 5 releasing runs + 6 training runs at eps 1 (Table 3's two LoRA rows among them) and the two
    # arms' uniform + moments runs (a release and a training each), each line in its own transcript
    sdp_ledgers = sorted(p for p in (results / "tiny" / "ledger").glob("straightdp_*.jsonl")
                         if p.name not in ("straightdp_toy.jsonl", "straightdp_table4_text.jsonl"))
    assert len(sdp_ledgers) == 15 and all(p.name in json.dumps(replay) for p in sdp_ledgers)
    table1 = pd.read_parquet(results / "tables" / "straightdp_table1_main.parquet")
    assert table1.loc[table1["arm"] != "main", "label"].tolist() == ["Uniform + moments [latent]",
                                                                     "Uniform + moments [low_b0]"]
    sweep = pd.read_parquet(results / "tables" / "straightdp_table2_noise_sweep.parquet")
    assert len(sweep) == 1 and sweep["grad_p90_over_p50_constrained"].notna().all()
    assert list(pd.read_parquet(results / "tables" / "straightdp_table2_ablation.parquet")["arm"]) == [
        "unconstrained", "low_b0"]
    frozen = pd.read_parquet(results / "tables" / "straightdp_table3_frozen.parquet")
    assert set(frozen["row"]) == {"public_guidance", "lora_uniform", "lora_moments"}
    assert (frozen["eps_certified"] <= 1).all()
    # Table 4 (Stage 1 only): its two releases (one eps, one seed) replayed with the rest
    t4_claims = [c for c in replay["claims"] if c["transcript"].endswith("straightdp_table4_text.jsonl")]
    assert len(t4_claims) == 2 and all(c["ok"] for c in t4_claims)
    assert len(pd.read_parquet(results / "tables" / "straightdp_table4_text.parquet")) == 2
    # Fig. 6's toy: its four lines (one eps, one seed) are replayed with the rest, within their budget
    toy_claims = [c for c in replay["claims"] if c["transcript"].endswith("straightdp_toy.jsonl")]
    assert len(toy_claims) == 4 and all(c["ok"] for c in toy_claims)
    toy = pd.read_parquet(results / "tables" / "straightdp_figure6_toy.parquet")
    assert len(toy) == 4 and (toy["eps_certified"].dropna() <= 1).all()
    assert (pd.read_parquet(results / "tables" / "straightdp_table1_main.parquet")["eps_certified"] <= 1).all()
    # DPDM's main sampler was chosen on val, by the checkpoint, among the ablation's samplers
    selection = json.loads((results / "tiny" / "dpdm" / "sampler_selection.json").read_text())
    main = pd.read_parquet(results / "tables" / "dpdm_table_main.parquet")
    assert selection["split"] == "val" and list(main["sampler"]) == [selection["sampler"]]
    assert list(main["sampler_chosen_on"]) == ["val"]
    # the one-run audit: one row per line of every private mechanism (the DPDM run, the task-specific DP-SGD
    # classifier's, DP-Diffusion's, PrivImage's, DP-LDM's and DP-Promise's two, the six STRAIGHTDP training runs and five releases, the
    # two arms' one of each, the toy's two of each, Table 4's two text releases, the EMPDEN cells, the seven
    # baselines and PrivImage's query), each passed
    audit = pd.read_parquet(results / "tables" / "audit_one_run.parquet")
    counts = audit["mechanism"].value_counts().to_dict()
    assert {k: counts.get(k) for k in ("dpsgd", "tha_dpsgd", "moment_release", "text_moment_release",
                                       "dp_merf_embedding", "pe_nn_histogram", "dp_hp_embedding", "dp_ntk_embedding",
                                       "dp_mepf_embedding", "privimage_semantic_histogram")} == {
        "dpsgd": 1 + 1 + 1 + 1 + 1 + 2, "tha_dpsgd": 6 + 2 + 2, "moment_release": 5 + 2 + 2, "text_moment_release": 2,
        "dp_merf_embedding": 1, "pe_nn_histogram": 1, "dp_hp_embedding": 1, "dp_ntk_embedding": 1,
        "dp_mepf_embedding": 1, "privimage_semantic_histogram": 1}
    assert counts.get("empden_outputwise_block", 0) >= 1 and audit["passed"].all()
    # membership inference: the DPDM run, its non-private twin and the six STRAIGHTDP flows (two DP-LoRA), every attack;
    # EMPDEN Table 13 has its numerical column
    mia = pd.read_parquet(results / "tables" / "audit_mia.parquet")
    assert sorted(mia.groupby("method")["run"].nunique().items()) == [("dpdm", 1), ("dpdm_twin", 1), ("straightdp", 6)]
    assert mia.loc[mia["private"], "under_curve"].all() and mia["auc"].between(0, 1).all()
    table13 = pd.read_parquet(results / "tables" / "empden_table13.parquet")
    assert table13["numerical_asr"].between(0.5, 1).all() and len(table13) == 4
    # the baselines: one certified run each within its target, scored by the shared evaluation
    baselines = pd.read_parquet(results / "tables" / "baselines.parquet")
    assert sorted(baselines["method"]) == ["dp_diffusion", "dp_hp", "dp_ldm", "dp_mepf", "dp_merf", "dp_ntk",
                                           "dp_promise", "pe", "privimage"]
    assert (baselines["eps_certified"] <= 3).all()
    # every method side by side: one row per evaluated run, a certified eps on every private row
    all_runs = pd.read_parquet(results / "tables" / "all_runs.parquet")
    assert set(all_runs["method"]) == {"reference", "empden", "dpdm", "straightdp", "dp_merf", "pe", "dpsgd_classifier",
                                       "dp_hp", "dp_ntk", "dp_mepf", "dp_diffusion", "privimage", "dp_ldm",
                                       "dp_promise"}
    assert not all_runs.duplicated(["method", "config", "seed"]).any()
    assert all_runs.groupby("method").size().to_dict() == {
        "reference": 1, "empden": 3, "dpdm": 2, "straightdp": 8 + 2, "dp_merf": 1, "pe": 1, "dpsgd_classifier": 1,
        "dp_hp": 1, "dp_ntk": 1, "dp_mepf": 1, "dp_diffusion": 1, "privimage": 1, "dp_ldm": 1,
        "dp_promise": 1}
    # PrivImage's row composes its query and its DP-SGD (two lines, the target met by the composition)
    privimage = all_runs[all_runs["method"] == "privimage"].iloc[0]
    assert privimage["mechanisms"] == "privimage_semantic_histogram,dpsgd" and privimage["eps_certified"] <= 3
    # DP-Promise's row composes its two phases' DP-SGD lines
    promise = all_runs[all_runs["method"] == "dp_promise"].iloc[0]
    assert promise["mechanisms"] == "dpsgd,dpsgd" and promise["eps_certified"] <= 3
    # DP-LDM's samples are its codes decoded to images (the evaluation scored them as images)
    assert np.load(results / "tiny" / "samples" / "baselines" / "dp_ldm_eps3_seed0.npz")["images"].shape[1:] == \
        np.load(results / "tiny" / "data" / "test.npz")["images"].shape[1:]
    private = all_runs[all_runs["private"]]
    assert private["eps_certified"].notna().all() and (private["eps_certified"] > 0).all()
    assert all_runs.loc[all_runs["method"] == "dp_merf", "cost_wall_s"].gt(0).all()
    # the audits' columns on the runs whose model was attacked / whose DP-SGD line was audited
    trained = all_runs[all_runs["method"].isin(["dpdm"]) | all_runs["config"].str.startswith(("uniform", "tha", "lora"))]
    assert trained["mia_auc_max"].notna().all() and trained["audit_eps_lb"].notna().all()
    assert all_runs.loc[all_runs["method"] == "pe", "mia_auc_max"].isna().all()
    assert (results / "figures" / "privacy_utility.png").stat().st_size > 10_000
    # every job that ran before the runtime table left its Snakemake benchmark row; all_runs' cost is from it
    runtime = pd.read_parquet(results / "tables" / "runtime.parquet")
    after = {"runtime_table", "runtime_figure", "all_runs_table", "privacy_utility_figure", "index_html",
             "report_tables"}
    assert {"train_dpdm", "import_public", "prepare_data", "replay", "audit_mia"} <= set(runtime["rule"])
    # the user's model, imported whole and hashed; EMPDEN and DPDM ran on it
    public_meta = read_denoiser_meta(results / "tiny" / "models" / "public_edm.pt")
    assert public_meta["stage"] == "import_public" and public_meta["sha256"] == folder_sha256(public_model)
    assert not (results / "tiny" / "train" / "pretrain_public").exists()
    # STRAIGHTDP's main flow is the user's SD3 (every Table 1 and Table 3 run of the main grid started from it); the
    # arms pretrained their own
    flow_meta = read_denoiser_meta(results / "tiny" / "models" / "straightdp" / "public_flow.pt")
    assert flow_meta["stage"] == "import_straightdp" and flow_meta["sha256"] == folder_sha256(tmp_path / "public sd3")
    pretrained = sorted(p.stem for p in (results / "tiny" / "benchmarks" / "pretrain_straightdp").glob("*.tsv"))
    assert "import_straightdp" in set(runtime["rule"]) and pretrained == ["latent", "low_b0"]
    dpdm_metrics = [json.loads(p.read_text()) for p in (results / "tiny" / "train" / "dpdm").glob("*.json")]
    from_public = [m for m in dpdm_metrics if m.get("init")]
    assert from_public and all(m["init_fresh_tensors"] == [] for m in from_public)  # every tensor from the user's
    assert not after & set(runtime["rule"]) and (runtime["wall_s"] > 0).all() and runtime["cpu_s"].notna().all()
    # one row per benchmark file but those of the jobs that ran after the table (84 jobs at this size)
    files = [p for p in (results / "tiny" / "benchmarks").rglob("*.tsv") if p.parent.name not in after]
    assert len(runtime) == len(files) >= 80
    # a DPDM row costs its run's training (shared by its samplers) plus its own sampling and evaluation
    train = runtime.loc[runtime["rule"] == "train_dpdm", "wall_s"].sum()
    assert (all_runs.loc[all_runs["method"] == "dpdm", "cost_wall_s"] > train).all()
    assert (results / "figures" / "runtime.png").stat().st_size > 10_000
    # the summary page: the verdict, the comparison figure (embedded), one headline row per method, references
    assert index.index("<section id='replay'") < index.index("<img") < index.index("One row per method")
    # one headline per private method, from its main configuration: never an ablation's label
    heads = private[private["headline"]]
    assert set(heads["method"]) == set(private["method"])
    shown = {label for label in set(private["label"]) if f"<td>{label}</td>" in index}
    assert "PASSED" in index and len(shown) == private["method"].nunique() and shown <= set(heads["label"])
    assert "DPDM (ablations)" not in shown and "Configuration:</b> <span" in index
    # no table prints a column of nothing that another table measures (cost columns of NaN, std over one seed)
    tables = {p.stem: pd.read_parquet(p) for p in (results / "tables").glob("*.parquet")}
    assert unmeasured_columns(tables) == []
    assert index.index("One row per method") < index.index("real held-out data")
    assert (results / "tiny" / "logs" / "train_evalnet.log").stat().st_size > 0
    check_bundles(repo, results, all_runs)
    # the reviewer's report from the finished run (runs no job): summary first, every table and figure with
    # its caption; then headless Chromium opens it (a broken page fails here rather than for a reader)
    report = tmp_path / "report.html"
    res = snakemake(repo, "--report", str(report), "--report-stylesheet", "report/style.css",
                    "--configfile", str(cfg))
    assert res.returncode == 0, res.stderr[-3000:]
    check_report(report.read_text(), results, tmp_path)
    # nothing left to do: a second run is a no-op
    again = snakemake(repo, "-n", "--cores", "2", "all", "--configfile", str(cfg))
    assert "Nothing to be done" in again.stdout + again.stderr
    # rerunning one configuration: editing one method's key replans that method's jobs only
    for key, (override, must, allowed) in RERUN_SCOPE.items():
        edit = tmp_path / f"edit_{key}.yaml"
        edit.write_text(yaml.safe_dump(override))
        res = snakemake(repo, "-n", "--cores", "2", "all", "--configfile", str(cfg), str(edit))
        assert res.returncode == 0, res.stderr[-2000:]
        jobs = planned_jobs(res.stdout + res.stderr)
        assert must in jobs and set(jobs) <= allowed | SHARED_RULES, (key, jobs)
    # a forged ledger stops the run in one line (issue #35): two runs' transcripts swapped, the replay reruns
    # (their times kept: a release transcript is also a training job's input, which Snakemake would rerun, and that
    # job refuses the forged release before the replay is reached; the replay is forced to run on the files as they are)
    a, b = sdp_ledgers[0], sdp_ledgers[-1]
    a_text, b_text, a_stat, b_stat = a.read_text(), b.read_text(), a.stat(), b.stat()
    a.write_text(b_text)
    b.write_text(a_text)
    for path, st in ((a, a_stat), (b, b_stat)):
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    res = snakemake(repo, "--cores", "1", "--forcerun", "replay", str(results / "tiny" / "ledger" / "replay.json"),
                    "--configfile", str(cfg))
    assert res.returncode != 0
    causes = [line for line in res.stderr.splitlines() if line.startswith("error: replay: replay FAILED: ")]
    assert len(causes) == 1 and any(f"{p}:1: run is " in causes[0] for p in (a, b)), res.stderr[-3000:]
    assert "the transcript is registered for" in causes[0]
    shutil.rmtree(results)


def test_nested_command_line_config_is_typed(repo, tmp_path):
    # 'false' and '2' arrive as strings; untyped, class_conditional would fail validation
    res = snakemake(repo, "-n", "--cores", "1", "all", "--config", f"results_dir={tmp_path / 'r'}",
                    "methods=[accounting, empden]", "dpdm={class_conditional: false, K: 2}")
    assert res.returncode == 0, res.stderr[-2000:]
    jobs = planned_jobs(res.stdout)
    assert "train_dpdm" not in jobs and "sensgeo_table_sdp" not in jobs and "empden_blocks" in jobs
    assert "train_evalnet" in jobs


def _index_inputs(stdout: str) -> str:
    """The tables the report shows (rule report_tables' inputs): every table of `all`."""
    return next(line for line in stdout.splitlines() if line.startswith("Shell command: python -m pipeline report_tables"))


def test_the_methods_list_switches_a_method_off(repo, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"results_dir": str(tmp_path / "results"), "methods": ["sensgeo", "dpdm"]}))
    res = snakemake(repo, "-n", "-p", "--cores", "1", "all", "--configfile", str(cfg))
    assert res.returncode == 0, res.stderr[-2000:]
    jobs = planned_jobs(res.stdout)
    assert {"sensgeo_table_sdp", "train_dpdm", "replay", "index_html", "train_evalnet"} <= set(jobs)
    # neither the EMPDEN accounting tables, nor its sampling grid, nor its diagnostics
    assert not [rule for rule in jobs if rule.startswith("empden")], jobs
    index = _index_inputs(res.stdout)
    assert "dpdm_table_main=" in index and "empden" not in index
    # the replay reads only the chosen methods' transcripts
    replay = next(line for line in res.stdout.splitlines() if line.startswith("Shell command: python -m pipeline replay"))
    assert "train_dpdm_" in replay and "empden" not in replay


def test_an_old_enabled_key_is_a_one_line_error_naming_the_methods_list(repo, tmp_path):
    cfg = tmp_path / "old.yaml"
    cfg.write_text("dpdm:\n  enabled: false\n")
    res = snakemake(repo, "-n", "--cores", "1", "--configfile", str(cfg))
    assert res.returncode != 0
    errors = [l for l in (res.stdout + res.stderr).splitlines() if "config error" in l]
    assert errors == ["config error at dpdm.enabled: methods are chosen by the top-level list `methods:` "
                      "(e.g. methods: [dpdm]); remove dpdm.enabled"]


#: a method's rule file as a new method writes it: its rule, and a wiring giving its targets and its ledger
#: transcript, registered from the file itself (under `sensgeo`, a name the schema's methods list accepts)
PLUGIN_SMK = """
class PluginWiring:
    def targets(self):
        return [TABLES / "plugin_table.parquet"]

    def resources(self, rule):
        return HOUSE.resources("all_runs_table")

    def transcripts(self):
        return {EXPDIR / "ledger" / "plugin_run.jsonl": TranscriptSpec(
            claims=3, run="plugin_run", stage="plugin", delta=1e-5, data=DATA / "private_train.npz",
            params={"count": 1})}


register(PluginWiring(), method="sensgeo")


rule plugin_table:
    output:
        table=TABLES / "plugin_table.parquet",
        ledger=EXPDIR / "ledger" / "plugin_run.jsonl",
    shell:
        "python -m pipeline plugin --out table={output.table:q} ledger={output.ledger:q}"
"""


def test_a_method_registered_only_in_its_own_rule_file_reaches_rule_all_the_index_and_the_replay(repo, tmp_path):
    (tmp_path / "plugin.smk").write_text(PLUGIN_SMK)
    # the repository's workflow, then one more rule file included after it (as the Snakefile includes a method)
    (tmp_path / "Snakefile").write_text(f'include: "{repo / "Snakefile"}"\ninclude: "plugin.smk"\n')
    results = tmp_path / "results"
    for methods, chosen in ((["sensgeo"], True), (["dpdm"], False)):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(yaml.safe_dump({"results_dir": str(results), "methods": methods}))
        res = snakemake(repo, "-n", "-p", "--cores", "1", "--snakefile", str(tmp_path / "Snakefile"), "all",
                        "--configfile", str(cfg))
        assert res.returncode == 0, res.stderr[-2000:]
        assert ("plugin_table" in planned_jobs(res.stdout)) is chosen
        assert (f"plugin_table={results / 'tables' / 'plugin_table.parquet'}" in _index_inputs(res.stdout)) is chosen
        replay = next(l for l in res.stdout.splitlines() if l.startswith("Shell command: python -m pipeline replay"))
        # the registration as JSON with sorted keys: its calibration's earlier transcripts (none), then its claims
        assert ('"plugin_run": {"after": [], "claims": 3' in replay) is chosen


def test_a_failed_job_shows_its_one_line_cause_on_the_console(repo, tmp_path):
    # MNIST's four files are there (a missing one stops the run before any job: the next test) but unreadable
    raw = tmp_path / "bad data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in idx_names():
        (raw / name).write_bytes(b"not an idx file")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"results_dir": str(tmp_path / "results"), "experiment": "x",
                                   "data": {"data_root": str(tmp_path / "bad data"),
                                            "private": {"source": "mnist"}}}))
    res = snakemake(repo, "--cores", "1", str(tmp_path / "results" / "x" / "data" / "test.npz"),
                    "--configfile", str(cfg))
    assert res.returncode != 0
    causes = [line for line in res.stderr.splitlines() if line.startswith("error: prepare_data: ")]
    assert len(causes) == 1 and f"could not read the idx files in {raw}" in causes[0], res.stderr[-3000:]


def _sha256s(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``folder``."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_missing_data_source_stops_before_any_job_and_a_finished_data_stage_survives(repo, tmp_path):
    # Issue #35: switching a finished run to a dataset that is not on disk passed the dry run, then
    # prepare_data failed after Snakemake had deleted every split (a job's outputs go before it runs).
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "results_dir": str(tmp_path / "results"), "experiment": "x"}))
    data = tmp_path / "results" / "x" / "data"
    built = snakemake(repo, "--cores", "1", str(data / "test.npz"), "--configfile", str(cfg))
    assert built.returncode == 0, built.stderr[-3000:]
    before = _sha256s(data)
    assert "reference.npz" in before and "private_train.json" in before

    empty = tmp_path / "no data"
    empty.mkdir()
    change = tmp_path / "mnist.yaml"
    change.write_text(yaml.safe_dump({"data": {"data_root": str(empty), "private": {"source": "mnist"}}}))
    for how in (("-n",), ()):  # the dry run says so too, not only the real one
        res = snakemake(repo, *how, "--cores", "1", "all", "--configfile", str(cfg), str(change))
        assert res.returncode != 0
        errors = [line for line in (res.stdout + res.stderr).splitlines() if "error" in line.lower()]
        assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
        assert errors[0].startswith(f"config error at data.private.source: MNIST not found: looked in "
                                    f"{empty / 'MNIST' / 'raw'} for train-images-idx3-ubyte"), errors
        assert "set data.data_root" in errors[0]
    assert _sha256s(data) == before

    # A split changed after it was written names the command that rebuilds it; a plain
    # `snakemake <split>` would do nothing, the file being newer than its inputs.
    reference = data / "reference.npz"
    split = load_split(reference)
    np.savez(reference, images=255 - split.images, labels=split.labels)
    with pytest.raises(CorruptFileError) as err:
        load_split(reference)
    hint = str(err.value).split("rebuild it: ")[1].removesuffix(" (with the run's --configfile, if any)")
    assert hint == f"snakemake --cores 1 --force {reference}"
    plain = snakemake(repo, "-n", "--cores", "1", str(reference), "--configfile", str(cfg))
    assert "Nothing to be done" in plain.stdout + plain.stderr, plain.stdout[-2000:]
    rebuilt = snakemake(repo, *shlex.split(hint)[1:], "--configfile", str(cfg))
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    np.testing.assert_array_equal(load_split(reference).images, split.images)
