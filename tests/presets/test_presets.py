"""Every paper preset (configs/*.yaml) runs end to end, at a tiny size, through Snakemake.

Each test writes the preset's datasets as small files in torchvision's on-disk layout
(tests/datasets.py), then runs ``snakemake --cores 2 all --configfile configs/<preset>.yaml
tiny.yaml``. The overrides in tiny.yaml are derived from the preset and shrink sizes only:
steps and epochs, sample, trajectory and split counts, the EDM step counts of the EMPDEN
sampler and accounting (N = 10 instead of 39/50), the PLD grid width (EMPDEN's h = 1e-5 to
1e-3), grids and ablation lists (each ablation the preset has keeps at least one row). They
keep each preset's data sources, resolution and channels, feature extractor, DPDM UNets,
samplers and the sections it switches on, with three exceptions:

* the EMPDEN presets' public UNet keeps its levels, attention, layers per block and dropout
  but is 1/8 as wide: the paper's 59M-parameter DDPM++ costs ~3 s per image and network call
  on one CPU core, and the samplers and diagnostics make hundreds of calls;
* the STRAIGHTDP presets' MM-DiT keeps its patch size but has one block of width 16 (the
  paper's 6 blocks of width 192 take seconds per DP-SGD step on a CPU);
* SENSGEO runs in the MNIST preset only (at a reduced size) and is left out of ``methods``
  in the others: it is analytic and reads only its own config section (no dataset, no image
  size), so it is the same in every preset.

Two presets are twins of another (``TWINS``): they differ from it only in where their data comes
from (and in the CLIP prompts' class names, which no preset reads: CLIP is off in all of them).
A twin is checked without its own end-to-end run, which would repeat its sibling's DAG job for job
(~8 minutes of CI for the STRAIGHTDP pair): its config must differ from its sibling's in those
keys only, its own datasets go through the real loaders (the data stages, run), and its dry run
must plan the same jobs, rule by rule, as its sibling's.

torch-fidelity's Inception weights are a download that tests never make (and no cache holds
them here), so each Inception preset is first run without them and must stop before any job
with the one-line config error naming the file and where to put it. Inception on a CPU costs
~1 s per image (299x299), so the whole DAG is then scored in the eval net's feature space,
and finally the reference row is scored in Inception's with a stand-in weights file of the
same architecture (random weights, ``inception_standin`` in conftest.py): the 299x299 feature
path runs end to end from the preset's resolution. Its FID values mean nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from pipeline.config import load_config, load_schema
from tests.conftest import planned_jobs
from tests.datasets import CELEBA_ATTRS, IDX_SOURCES, write_celeba, write_cifar10, write_idx, write_image_folder

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
REPO = Path(__file__).resolve().parents[2]
#: configs/digits_full.yaml is no paper preset but the embedded default's reference run (config.yaml's quick tour
#: restored to the schema's defaults; tests/test_config.py holds it there), so the tier leaves it out
REFERENCE_RUN = "digits_full"
PRESETS = sorted(p.stem for p in (REPO / "configs").glob("*.yaml") if p.stem != REFERENCE_RUN)
#: twin -> the preset it repeats with other data (see the module docstring); the sibling runs end to end
TWINS = {"fashion": "mnist", "straightdp_fashion": "straightdp_kmnist"}
#: what a twin may change (dotted config keys, after config.yaml and the preset are merged): its data sources,
#: and the CLIP prompts (``evaluation.clip``, off in every preset: ``test_twin_preset_...`` holds it off)
TWIN_KEYS = {"experiment", "data.private.source", "data.public.source", "straightdp.public.source",
             "evaluation.clip.class_names", "evaluation.clip.template"}
#: the rules that read a preset's datasets (the wrong-domain public set is STRAIGHTDP's own)
DATA_RULES = {"prepare_data": None, "straightdp_public": "straightdp"}
SCHEMA = load_schema()

#: images per official split written for a preset (12 and 9 per class where there are 10
#: classes); the test split holds eval_train + reference + val + test below
N_TRAIN, N_TEST = 120, 90
HELD_OUT = {"n_eval_train": 40, "n_reference": 10, "n_val": 10, "n_test": 30}
N_PUBLIC_FOLDER = 40
#: the public EDM UNet of the EMPDEN presets, width divided by this (see the module docstring)
EMPDEN_UNET_WIDTH_DIVISOR = 8
#: the one preset that runs SENSGEO (see the module docstring)
SENSGEO_IN = "mnist"
#: how the workflow runs: on 2 cores, with every job on one of them. Above 16x16 the rules ask
#: for 4 threads, which would run the jobs one at a time; at this size a job is mostly
#: interpreter start-up, so two run at once instead (outputs do not depend on it)
RUN = ("--cores", "2", "--max-threads", "1")
#: each Snakemake call; a preset takes a few minutes on 2 cores
TIMEOUT_S = 1500

pytestmark = pytest.mark.presets


# --------------------------------------------------------------------------------------
# the preset's datasets, tiny, in torchvision's layout
# --------------------------------------------------------------------------------------


def _labelled(rng: np.random.Generator, n: int, shape: tuple[int, ...], classes: int = 10) -> tuple:
    """``n`` random uint8 images of ``shape`` with every class present (round-robin labels)."""
    return rng.integers(0, 256, (n, *shape), dtype=np.uint8), (np.arange(n) % classes).astype(np.uint8)


def _write_celeba(root: Path, rng: np.random.Generator) -> None:
    # official partitions: 0 train, 1 valid (never read), 2 test
    partition = [0] * N_TRAIN + [1] * 10 + [2] * N_TEST
    attrs = rng.integers(0, 2, (len(partition), len(CELEBA_ATTRS)))
    colours = rng.integers(0, 256, (len(partition), 2, 3))
    write_celeba(root, partition, attrs, colours)


def write_source(source: str, root: Path, rng: np.random.Generator) -> None:
    """Write the dataset ``source`` (a data.private/public.source value) under ``root``."""
    if source in IDX_SOURCES:
        train, test = _labelled(rng, N_TRAIN, (28, 28)), _labelled(rng, N_TEST, (28, 28))
        write_idx(root / IDX_SOURCES[source] / "raw", train, test, gz=False)
    elif source == "cifar10":
        write_cifar10(root, _labelled(rng, N_TRAIN, (3, 32, 32)), _labelled(rng, N_TEST, (3, 32, 32)))
    elif source == "celeba":
        _write_celeba(root, rng)
    else:
        raise AssertionError(f"no writer for data source {source!r}: add one to tests/presets")


def write_datasets(preset: dict[str, Any], root: Path) -> dict[str, Any]:
    """Every dataset ``preset`` reads, under ``root``; returns the data overrides that point there."""
    rng = np.random.default_rng(0)
    data = preset["data"]
    write_source(data["private"]["source"], root, rng)
    # the presets' null n_private_train declares the whole official train split (60,000 MNIST digits, ...): the
    # tiny stand-in declares its own size, which the releases normalise by (pipeline.config.declared_private)
    overrides: dict[str, Any] = {"data_root": str(root), "private": {"n_private_train": N_TRAIN, **HELD_OUT}}
    public = data.get("public", {}).get("source", "printed_digits")
    if public == "image_folder":
        # ImageNet32 / FFHQ-64 stand-ins at the preset's resolution
        size = data["image_size"]
        images, labels = _labelled(rng, N_PUBLIC_FOLDER, (3, size, size))
        write_image_folder(root / "public_folder", images, labels)
        overrides["public"] = {"path": str(root / "public_folder")}
    elif public not in ("none", "printed_digits") and public != data["private"]["source"]:
        write_source(public, root, rng)
    # STRAIGHTDP's own wrong-domain public set (KMNIST, Fashion-MNIST)
    own = preset.get("straightdp", {}).get("public", {}).get("source")
    if own in IDX_SOURCES and own not in (public, data["private"]["source"]):
        write_source(own, root, rng)
    return overrides


# --------------------------------------------------------------------------------------
# tiny overrides, derived from the preset
# --------------------------------------------------------------------------------------


def _tiny_dpdm(d: dict[str, Any]) -> dict[str, Any]:
    """DPDM at two DP-SGD steps: the preset's smallest and largest eps (so a
    parameterisation_by_epsilon entry still applies), 3-step samplers, and each ablation the
    preset has at its smallest size (K ablation: two values; configuration ablation: the run
    the main table trains at that eps, so it adds no training run)."""
    eps = sorted(d["epsilons"])
    eps = [eps[0], eps[-1]] if len(eps) > 1 else eps
    out: dict[str, Any] = {
        "epsilons": eps, "batch_size": 8, "epochs": 0.1, "K": 2, "micro_batch": 8,
        "sampling": {"n_samples": 20, "batch_size": 20, "per_class": 1,
                     "samplers": {name: {"steps": 3} for name in d["sampling"]["samplers"]}},
        # the task-specific DP-SGD classifier at two steps, Fig. 3 at two K of one public image
        "dpsgd_classifier": {"batch_size": 8, "epochs": 0.1, "micro_batch": 8},
        "gradient_variance": {"K": [1, 2], "repeats": 4, "n_images": 1, "bootstrap": 20},
    }
    if d.get("noise_multiplicity"):
        out["noise_multiplicity"] = {"epsilon": eps[-1], "K": [1, 2]}
    if d.get("sampler_ablation"):
        out["sampler_ablation"] = {"epsilons": [eps[-1]], "samplers": d["sampler_ablation"]["samplers"]}
    if d.get("parameterisation_ablation"):
        at = d["parameterisation_ablation"]["epsilon"]
        by_eps = {float(k): v for k, v in d.get("parameterisation_by_epsilon", {}).items()}
        out["parameterisation_ablation"] = {"epsilon": at, "parameterisations": [by_eps.get(float(at), d["parameterisation"])]}
    return out


def _narrow_unet(unet: dict[str, Any]) -> dict[str, Any]:
    widths = [max(8, c // EMPDEN_UNET_WIDTH_DIVISOR) for c in unet["block_out_channels"]]
    return {"block_out_channels": widths, "norm_num_groups": 8}


def _tiny_empden(e: dict[str, Any], B: int) -> dict[str, Any]:
    """One grid cell (the preset's first p at T = 3), and each ablation the preset has at that
    cell with two values; full-batch cells at the preset's extreme sigma_min."""
    p = e["grid"][0]["p"][0]
    out: dict[str, Any] = {"grid": [{"p": [p], "B": [B], "T": [3]}]}
    if e.get("beta_ablation"):
        out["beta_ablation"] = {"p": p, "B": B, "T": 3, "beta": sorted({1, max(e["beta_ablation"]["beta"])})}
    if e.get("repeated_seeds"):
        out["repeated_seeds"] = {"p": [p], "B": B, "T": 3, "seeds": e["repeated_seeds"]["seeds"][:2]}
    if e.get("figure2"):
        out["figure2"] = {"p": p, "B": B, "T": 3, "n_rows": 2, "n_columns": 3}
    sigma_min = e.get("full_batch", {}).get("sigma_min")
    if sigma_min:
        out["full_batch"] = {"sigma_min": sorted({min(sigma_min), max(sigma_min)})}
    return out


def _tiny_straightdp(s: dict[str, Any]) -> dict[str, Any]:
    """STRAIGHTDP at its smallest eps and first seed, every Table 1 row the preset has: a one-block
    MM-DiT at the preset's patch size, two steps of each training, 20 samples of 2 Euler steps; Fig. 6's
    toy and every arm at one eps and seed."""
    return {
        "epsilons": [min(s["epsilons"])], "seeds": s["seeds"][:1], "public": {"n": N_TRAIN},
        "flow": {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8, "joint_attention_dim": 8,
                 "caption_tokens": 2},
        "pretrain": {"steps": 2, "batch_size": 8}, "release": {"p": 8, "rank": 4},
        "horizon": {"n_times": 4, "n_probe": 8}, "distill": {"steps": 2, "batch_size": 8},
        "dpsgd": {"steps": 2, "batch_size": 16, "micro_batch": 16, "proxy_examples": 4, "buckets": 2,
                  "betas": [0, 1]},
        "sampling": {"n_samples": 20, "batch_size": 20, "steps": 2},
        # Fig. 6's toy at one point per line (data.toy.n is 200 here: its DP-SGD batch must stay below it)
        "toy": {"epsilons": [1], "seeds": [0], "hidden": 8, "pretrain_steps": 10, "distill_steps": 2,
                "dpsgd_steps": 2, "dpsgd_batch_size": 40, "n_eval": 20},
        # every arm at the same point (Table 2's references are that point's main runs); a few autoencoder steps
        "arms": {name: {**arm, "epsilons": [min(s["epsilons"])], "seeds": s["seeds"][:1],
                        **({"autoencoder": {"steps": 5, "width": 8}} if arm.get("space") == "latent" else {})}
                 for name, arm in (s.get("arms") or {}).items()},
    }


def methods(preset: dict[str, Any]) -> list[str]:
    """The preset's ``methods`` (what ``all`` builds), else the schema's default."""
    return preset.get("methods", SCHEMA["properties"]["methods"]["default"])


def tiny_overrides(preset: dict[str, Any], data: dict[str, Any], results: Path) -> dict[str, Any]:
    """The override file merged over ``preset``: sizes only (see the module docstring)."""
    chosen = methods(preset)
    over: dict[str, Any] = {
        "results_dir": str(results),
        # the bundles' export and verification run in the tiny end-to-end DAG (tests/test_workflow.py); here ~15
        # export jobs per preset would add minutes of CI to a tier that proves each preset's own DAG
        "bundles": False,
        "data": {**data, "toy": {"n": 200}},
        "evaluation": {"batch_size": 50, "kid_subsets": 10, "kid_subset_size": 20, "evalnet": {"epochs": 1},
                       "downstream": {"cnn_epochs": 1, "repeats": 1, "mlp_hidden": 16}},
    }
    if "sensgeo" in chosen:
        if preset["experiment"] == SENSGEO_IN:
            over["sensgeo"] = {"fig1": {"n_covariances": 50}, "sdp": {"m": [4], "d": [2]}}
        else:
            over["methods"] = [m for m in chosen if m != "sensgeo"]
    if "dpdm" in chosen:
        over["dpdm"] = _tiny_dpdm(preset["dpdm"])
    if "straightdp" in chosen:
        over["straightdp"] = _tiny_straightdp(preset["straightdp"])
    if {"accounting", "empden", "empden_diagnostics"} & set(chosen):
        B = 25
        p = preset["empden"]["grid"][0]["p"][0]
        over["accounting"] = {"n": N_TRAIN, "N_out": 10, "N": 10, "N_full_batch": 10, "discretisation": 1.0e-3,
                              "p": [p], "B": [B], "sigma_min_sweep": [0.002, 5], "asr_q": [0.01], "asr_N": 40}
        over["empden"] = _tiny_empden(preset["empden"], B)
    if {"accounting", "empden", "empden_diagnostics", "dpdm"} & set(chosen):
        # the public denoiser: EMPDEN's, and DPDM's Fig. 3 measures on it (at the preset's 600 steps it alone
        # took ~580 s of the mnist preset's tiny run)
        unet = preset.get("pretrain", {}).get("unet")  # a preset without one keeps config.yaml's small UNet
        over["pretrain"] = {"steps": 2, "batch_size": 4, **({"unet": _narrow_unet(unet)} if unet else {})}
    if "empden_diagnostics" in chosen:
        over["empden_diagnostics"] = {
            "n_trajectories": 2, "batch_size": 2, "proxy_N": 8, "proxy_seeds": 1, "swap_N": 8,
            "critical_window_N": 8, "bootstrap_resamples": 100,
            "windows": [{"name": "early", "first": 1, "last": 3}, {"name": "all steps", "first": 0, "last": 7}]}
    return over


# --------------------------------------------------------------------------------------
# running and reading the workflow
# --------------------------------------------------------------------------------------


def snakemake(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    run_env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **(env or {})}
    return subprocess.run([SNAKEMAKE, *args], cwd=REPO, capture_output=True, text=True, env=run_env,
                          timeout=TIMEOUT_S)


def summary_outputs(configfiles: list[str]) -> dict[Path, str]:
    """Every file of the ``all`` DAG with Snakemake's status for it (``snakemake --summary``)."""
    res = snakemake("--summary", "--cores", "1", "all", "--configfile", *configfiles)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [line.split("\t") for line in res.stdout.splitlines() if "\t" in line]
    header = rows[0]
    assert header[0] == "output_file" and "status" in header, header
    return {Path(r[0]): r[header.index("status")] for r in rows[1:]}


def uses_inception(preset: dict[str, Any]) -> bool:
    return preset.get("evaluation", {}).get("feature_extractor") == "inception-v3-compat"


def image_shape(preset: dict[str, Any]) -> list[int]:
    channels = 1 if preset["data"]["private"]["source"] in IDX_SOURCES else 3
    size = preset["data"]["image_size"]
    return [channels, size, size]


# --------------------------------------------------------------------------------------
# the tests
# --------------------------------------------------------------------------------------


def flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``config`` as dotted keys (``data.private.source``) to leaf values."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def dry_run_jobs(configfiles: list[str]) -> dict[str, int]:
    """The jobs a dry run of ``all`` plans, rule by rule."""
    res = snakemake("-n", "--cores", "2", "all", "--configfile", *configfiles)
    assert res.returncode == 0, res.stderr[-3000:]
    return planned_jobs(res.stdout + res.stderr)


def write_tiny(name: str, root: Path) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The preset ``name``, its tiny overrides (datasets written under ``root``; scored in the eval
    net's feature space) and the config files that run it."""
    preset = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
    overrides = tiny_overrides(preset, write_datasets(preset, root / "data"), root / "results")
    if uses_inception(preset):
        # no Inception weights here (the end-to-end test below checks that and uses a stand-in)
        overrides["evaluation"]["feature_extractor"] = "evalnet"
    cfg = root / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(overrides))
    return preset, overrides, [f"configs/{name}.yaml", str(cfg)]


def test_every_preset_is_covered():
    assert PRESETS == ["celeba32", "celeba64", "cifar10", "fashion", "mnist", "straightdp_fashion", "straightdp_kmnist"]
    assert set(TWINS) | set(TWINS.values()) <= set(PRESETS) and not set(TWINS) & set(TWINS.values())


@pytest.mark.parametrize("name", sorted(TWINS))
def test_twin_preset_reads_its_own_data_and_plans_its_siblings_jobs(name, tmp_path):
    sibling = TWINS[name]
    twin_cfg = flat(load_config(REPO / "config.yaml", REPO / "configs" / f"{name}.yaml"))
    sibling_cfg = flat(load_config(REPO / "config.yaml", REPO / "configs" / f"{sibling}.yaml"))
    changed = {k for k in twin_cfg.keys() | sibling_cfg.keys() if twin_cfg.get(k, "absent") != sibling_cfg.get(k, "absent")}
    assert changed <= TWIN_KEYS, f"{name} is no twin of {sibling}: it also changes {sorted(changed - TWIN_KEYS)}"
    assert not twin_cfg["evaluation.clip.enabled"] and not sibling_cfg["evaluation.clip.enabled"]

    # the same DAG as its sibling's (which runs end to end), with the methods the twin runs
    preset, overrides, configfiles = write_tiny(name, tmp_path / name)
    _, sibling_over, sibling_files = write_tiny(sibling, tmp_path / sibling)
    sibling_over["methods"] = overrides.get("methods", methods(preset))
    Path(sibling_files[1]).write_text(yaml.safe_dump(sibling_over))
    twin_jobs = dry_run_jobs(configfiles)
    assert twin_jobs and twin_jobs == dry_run_jobs(sibling_files)

    # its own datasets, through the real loaders: the data stages of that DAG, run
    rules = [r for r, method in DATA_RULES.items() if method is None or method in methods(preset)]
    assert set(rules) <= set(twin_jobs)
    res = snakemake(*RUN, "all", "--until", *rules, "--configfile", *configfiles)
    assert res.returncode == 0, res.stderr[-5000:]
    exp = tmp_path / name / "results" / preset["experiment"]
    # (the toy split is 2-D points drawn from data.toy, no dataset)
    manifests = {m.stem: json.loads(m.with_suffix(".json").read_text()) for m in exp.rglob("*.npz") if m.stem != "toy"}
    declared = {"public": twin_cfg.get("data.public.source"), "straightdp_public": twin_cfg.get("straightdp.public.source")}
    sources = {split: m["source"] for split, m in manifests.items()}
    assert sources == {split: declared.get(split, twin_cfg["data.private.source"]) for split in manifests}
    assert "private_train" in sources and set(declared) & set(sources), sources
    assert all(m["shape"] == image_shape(preset) for m in manifests.values()), manifests


@pytest.mark.parametrize("name", sorted(set(PRESETS) - set(TWINS)))
def test_preset_runs_end_to_end_at_tiny_size(name, tmp_path, request):
    preset = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
    results = tmp_path / "results"
    overrides = tiny_overrides(preset, write_datasets(preset, tmp_path / "data"), results)
    cfg = tmp_path / "tiny.yaml"
    configfiles = [f"configs/{name}.yaml", str(cfg)]
    exp = results / preset["experiment"]
    start = time.monotonic()

    inception = uses_inception(preset)
    if inception:
        # No weights anywhere (an empty torch hub) must stop the run before any job is scheduled
        # with one actionable line (pipeline.inputs), not hours in at the first evaluation.
        cfg.write_text(yaml.safe_dump(overrides))
        hub = tmp_path / "empty_torch_home"
        res = snakemake(*RUN, "all", "--configfile", *configfiles, env={"TORCH_HOME": str(hub)})
        assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
        lines = [line for line in (res.stdout + res.stderr).splitlines() if "config error" in line]
        assert len(lines) == 1, res.stderr[-3000:]
        expected = hub / "hub" / "checkpoints" / "weights-inception-2015-12-05-6726825d.pth"
        assert lines[0].startswith(f"config error at evaluation.inception_weights: inception-v3-compat weights "
                                   f"not found at {expected}: copy weights-inception-2015-12-05-6726825d.pth there")
        assert not exp.exists(), "no job may run"
        # Inception on a CPU costs ~1 s per image (299x299), so the DAG is scored in the eval
        # net's space and the reference row in Inception's (the last step below)
        overrides["evaluation"]["feature_extractor"] = "evalnet"

    cfg.write_text(yaml.safe_dump(overrides))
    res = snakemake(*RUN, "all", "--configfile", *configfiles)
    assert res.returncode == 0, res.stderr[-5000:]

    # every file of the DAG of `all` exists and is up to date, so a rerun has nothing to do
    outputs = summary_outputs(configfiles)
    assert outputs and all(p.exists() for p in outputs), [str(p) for p in outputs if not p.exists()]
    assert set(outputs.values()) == {"ok"}, {str(p): s for p, s in outputs.items() if s != "ok"}
    again = snakemake("-n", "--cores", "2", "all", "--configfile", *configfiles)
    assert "Nothing to be done" in again.stdout + again.stderr

    # every table has rows and its view in the report, the summary page exists, and the replay recomputed
    # every claim
    tables = sorted((results / "tables").glob("*.parquet"))
    assert tables and {t for t in outputs if t.suffix == ".parquet" and t.parent.name == "tables"} == set(tables)
    assert "One row per method" in (results / "index.html").read_text()
    for table in tables:
        assert len(pd.read_parquet(table)) >= 1, table.name
        assert (results / "report" / "tables" / f"{table.stem}.html").is_file(), table.name
    replay = json.loads((exp / "ledger" / "replay.json").read_text())
    assert replay["all_ok"], replay
    ledgers = [p for p in outputs if p.suffix == ".jsonl" and p.parent.name == "ledger"]
    assert ledgers and replay["n_transcripts"] == len(ledgers) and replay["n_claims"] >= len(ledgers)

    # the preset's resolution and channels reached every split and every sample set
    # (STRAIGHTDP's folder holds arrays that are not image splits: the PCA geometry, the releases)
    manifests = [p.with_suffix(".json") for p in outputs if p.suffix == ".npz" and p.stem != "toy"
                 and p.relative_to(exp).parts[0] != "straightdp"]
    shapes = {str(m.relative_to(exp)): json.loads(m.read_text())["shape"] for m in manifests}
    assert shapes and all(s == image_shape(preset) for s in shapes.values()), shapes
    reference = json.loads((exp / "eval" / "reference_real" / "metrics.json").read_text())
    assert reference["feature_extractor"] == "evalnet" if inception else preset["evaluation"]["feature_extractor"]
    assert np.isfinite(reference["fid"])

    if inception:
        # the preset's own feature space, with a stand-in weights file where the real one goes
        overrides["evaluation"].update(feature_extractor="inception-v3-compat",
                                       inception_weights=str(request.getfixturevalue("inception_standin")))
        cfg.write_text(yaml.safe_dump(overrides))
        res = snakemake(*RUN, str(results / "tables" / "reference_real.parquet"), "--configfile", *configfiles)
        assert res.returncode == 0, res.stderr[-5000:]
        reference = json.loads((exp / "eval" / "reference_real" / "metrics.json").read_text())
        assert reference["feature_extractor"] == "inception-v3-compat" and np.isfinite(reference["fid"])
        table = pd.read_parquet(results / "tables" / "reference_real.parquet")
        assert table["feature_extractor"].tolist() == ["inception-v3-compat"]
    print(f"preset {name}: end to end in {time.monotonic() - start:.0f} s")
    shutil.rmtree(results)
