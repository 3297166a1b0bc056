"""STRAIGHTDP's DAG stages end to end at a tiny size: each stage's files, ledger lines and errors.

The mechanisms themselves (release calibration, THA accounting, clipping, noise) are specified in
``tests/privacy/test_moments.py`` and ``tests/privacy/test_tha.py``; here the stages are checked to
wire them as the paper's Sec. 3 says: one ledger line per mechanism, the composition of Stage 1
and Stage 2 within the run's total eps, public data only where the paper says public.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.methods.straightdp import stages as sdp
from pipeline.io import Split, load_split, read_json, save_split
from pipeline.models.checkpoint import read_denoiser_backbone
from pipeline.privacy import accountants as acc
from pipeline.privacy import dpsgd, ledger, tha
from pipeline.privacy.certify import recompute
from pipeline.stage import PipelineError
from pipeline.training.data import to_model_scale
from pipeline.methods.straightdp.runs import StraightRun
from tests.conftest import one_thread

TINY = {
    "delta": 1e-5,
    "public": {"n": 120},
    "flow": {"patch_size": 2, "num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8,
             "joint_attention_dim": 8, "caption_tokens": 2},
    "pretrain": {"steps": 20, "batch_size": 16},
    "release": {"p": 8, "rank": 4},
    "horizon": {"n_times": 5, "n_probe": 16},
    "distill": {"steps": 6, "batch_size": 16},
    "dpsgd": {"steps": 3, "batch_size": 32, "buckets": 2, "betas": [0, 1], "micro_batch": 32,
              "proxy_examples": 8, "noise_multiplicity": 2},
    "sampling": {"n_samples": 12, "steps": 3, "batch_size": 12},
}
#: the tiny world's declared private constants (the config's data.private): 150 records of 3 classes
PRIVATE = {"N": 150, "n_classes": 3}
#: the stages' ledger binding (the rules pass the run's name and the experiment)
BINDING = {"run": "r", "experiment": "exp"}


def blobs(n: int, n_classes: int, seed: int) -> Split:
    """``n`` 8x8 grey images whose brightness pattern depends on the label (a learnable class signal)."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % n_classes
    base = rng.uniform(40, 215, (n_classes, 1, 8, 8))
    x = base[y] + rng.normal(0, 20, (n, 1, 8, 8))
    return Split(np.clip(x, 0, 255).astype(np.uint8), y.astype(np.int64))


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """Private data (3 classes), a public set of another domain (3 other glyphs), geometry and a public flow."""
    return make_world(tmp_path_factory.mktemp("straightdp"), TINY)


def make_world(root: Path, cfg: dict) -> dict[str, Path]:
    """:func:`world` under ``root`` with the straightdp section ``cfg``."""
    paths = {"data": root / "private.npz", "public": root / "public.npz", "geometry": root / "geometry.npz",
             "horizon": root / "horizon.json", "init": root / "public_flow.pt"}
    save_split(paths["data"], blobs(150, 3, 0), name="train", source="test", seed=0)
    save_split(paths["public"], blobs(120, 3, 1), name="public", source="test", seed=0)
    with one_thread():
        sdp.straightdp_geometry({"public": paths["public"]}, {k: paths[k] for k in ("geometry", "horizon")},
                                {"straightdp": cfg})
        sdp.pretrain_straightdp({"public": paths["public"]}, {"model": paths["init"]},
                                {"straightdp": cfg, "n_classes": 3, "device": "cpu",
                                 "checkpoint_dir": str(root / "ck_pretrain")})
    return paths


def release(world: dict[str, Path], tmp_path: Path, run: str) -> dict[str, Path]:
    out = {"moments": tmp_path / f"{run}.moments.npz", "ledger": tmp_path / f"{run}.release.jsonl"}
    sdp.release_moments({"data": world["data"], "geometry": world["geometry"]}, out,
                        {"straightdp": TINY, "run": run, "private": PRIVATE, "ledger_binding": BINDING})
    return out


def only_line(path: Path) -> ledger.LedgerEntry:
    (entry,) = [e for _, e in ledger.read_ledger(path)]
    return entry


def test_geometry_and_horizon_come_from_public_data_only(world):
    h = read_json(world["horizon"])
    assert 0 <= h["tau"] <= h["tau_max"] == 0.35 and h["n_public"] == 120
    assert len(h["ts"]) == len(h["conditional_worst"]) == 5 and h["conditional_worst"][0] == pytest.approx(1, abs=1e-6)
    geometry, spectrum = sdp.read_geometry(world["geometry"])
    basis = geometry.basis
    assert basis.shape == (8, 64) and np.allclose(basis @ basis.T, np.eye(8), atol=1e-8)
    assert geometry.R > 0 and spectrum.shape == (64,) and np.all(np.diff(spectrum[:4]) <= 0)


def test_the_public_flow_knows_the_private_label_count_and_nothing_private(world):
    kind, spec = read_denoiser_backbone(world["init"])
    assert spec.num_classes == 3 and spec.image_size == 8 and spec.channels == 1
    meta = torch.load(world["init"], weights_only=False).get("meta", {})
    assert meta.get("private") is False


def test_a_full_budget_release_writes_one_certified_line_within_the_run_eps(world, tmp_path):
    out = release(world, tmp_path, "released_only_eps1_seed0")
    entry = only_line(out["ledger"])
    assert entry.mechanism == "moment_release" and entry.extra["target_epsilon"] == 1.0
    assert recompute(entry) <= 1.0 and entry.claimed_epsilon <= 1.0


def test_with_both_stages_the_release_targets_its_weight_share(world, tmp_path):
    out = release(world, tmp_path, "tha_moments_eps1_seed0")
    entry = only_line(out["ledger"])
    assert entry.extra["target_epsilon"] == pytest.approx(0.2 / 0.85)
    assert recompute(entry) <= 0.2 / 0.85 + 1e-9


def test_release_seeds_draw_different_noise(world, tmp_path):
    a = np.load(release(world, tmp_path, "released_only_eps1_seed0")["moments"])
    b = np.load(release(world, tmp_path, "released_only_eps1_seed1")["moments"])
    assert not np.allclose(a["mu"], b["mu"])


def train(world: dict[str, Path], tmp_path: Path, run: str) -> tuple[dict[str, Path], dict[str, Path]]:
    """Stage 2 of ``run`` on the tiny world (after its own release when the row distils one): inputs, outputs."""
    inputs = {k: world[k] for k in ("data", "public", "init", "geometry", "horizon")}
    if StraightRun.from_name(run).distills:
        rel = release(world, tmp_path, run)
        inputs |= {"moments": rel["moments"], "release_ledger": rel["ledger"]}
    out = {"model": tmp_path / "m.pt", "ledger": tmp_path / "train.jsonl", "metrics": tmp_path / "metrics.json"}
    with one_thread():
        sdp.train_straightdp(inputs, out, {"straightdp": TINY, "run": run, "device": "cpu", "private": PRIVATE,
                                           "ledger_binding": BINDING,
                                           "checkpoint_dir": str(tmp_path / "ck")})
    return inputs, out


@pytest.mark.parametrize("run", ["tha_moments_eps1_seed0", "uniform_eps1_seed0"])
def test_stage2_composes_with_the_release_within_the_total_eps(world, tmp_path, run):
    inputs, out = train(world, tmp_path, run)
    entry = only_line(out["ledger"])
    metrics = read_json(out["metrics"])
    assert entry.mechanism == "tha_dpsgd" and metrics["steps"] == 3
    alone = recompute(entry)
    if "release_ledger" in inputs:
        prior = sdp.release_event(inputs["release_ledger"])
        total = acc.pld_epsilon(tha.with_prior(entry.dp_event(), prior), entry.delta,
                                settings=dpsgd.DPSGD_PLD_SETTINGS)
        assert alone < total <= 1.0 and 0 < metrics["tau"] <= 0.35
        assert set(metrics["proxy_scores"]) == {"0.0", "1.0"} and len(metrics["clips"]) == 2
    else:
        assert alone <= 1.0 and metrics["tau"] == 0 and metrics["edges"] == [0.0, 1.0]
    assert metrics["noise_std"] > 0 and "loss" not in " ".join(metrics)
    # App. D.3's gradient-norm log: per bucket, flagged as the non-private diagnostic it is
    log = metrics["grad_norms_non_private_diagnostic"]
    assert "NOT DP" in log["note"] and log["per_bucket"]
    for row in log["per_bucket"].values():
        assert 0 < row["p50"] <= row["p90"] and row["p90_over_p50"] >= 1 and 0 <= row["clip_fraction"] <= 1
    assert sum(row["steps"] for row in log["per_bucket"].values()) <= metrics["steps"]
    assert metrics["backbone_constraints"] == {"stream_clamp": None, "late_injection": 0,
                                               "decoupled_attention": False, "post_hoc": False}


def test_each_row_samples_from_what_the_paper_says(world, tmp_path):
    rel = release(world, tmp_path, "released_only_eps1_seed0")
    common = {"straightdp": TINY, "device": "cpu"}
    cases = {
        "released_only_eps1_seed0": {"moments": rel["moments"]},
        "public_guidance_eps1_seed0": {"moments": rel["moments"], "model": world["init"]},
        "uniform_eps1_seed0": {"model": world["init"]},
    }
    for run, inputs in cases.items():
        out = tmp_path / f"{run}.samples.npz"
        with one_thread():
            sdp.sample_straightdp(inputs, {"samples": out}, {**common, "run": run, "shape": [1, 8, 8]})
        s = load_split(out)
        assert s.images.shape == (12, 1, 8, 8) and np.bincount(s.labels).tolist() == [4, 4, 4]
        assert s.images.std() > 0


def test_bf16_sampling_records_its_precision_and_draws_what_float32_draws_within_bfloat16_rounding(world, tmp_path):
    from pipeline.io import manifest_path, read_json

    params = {"straightdp": TINY, "device": "cpu", "run": "uniform_eps1_seed0", "shape": [1, 8, 8]}
    out = {p: tmp_path / f"{p}.npz" for p in ("fp32", "bf16")}
    with one_thread():
        sdp.sample_straightdp({"model": world["init"]}, {"samples": out["fp32"]}, params)
        sdp.sample_straightdp({"model": world["init"]}, {"samples": out["bf16"]}, {**params, "precision": "bf16"})
    fp32, bf16 = load_split(out["fp32"]), load_split(out["bf16"])
    meta = {p: read_json(manifest_path(path)) for p, path in out.items()}
    assert meta["bf16"]["precision"] == "bf16" and "precision" not in meta["fp32"]
    # the same labels and starting noise; the velocity's matmuls in bfloat16 move a pixel by a few levels at most
    assert (fp32.labels == bf16.labels).all() and not (fp32.images == bf16.images).all()
    assert np.abs(fp32.images.astype(int) - bf16.images.astype(int)).mean() < 8


def test_the_backbone_switches_are_known_params_without_defaults():
    """Sec. 3.3's opt-in switches have no schema default (config_ids without them are unchanged) but
    are valid params: the diagnostics' pretrain_straightdp once refused them as unknown keys."""
    switches = {"stream_clamp": 16, "late_injection": 1, "decoupled_attention": True}
    cfg = sdp.section({"straightdp": {"flow": switches}})
    assert {k: cfg["flow"][k] for k in switches} == switches
    assert not set(switches) & set(sdp.section({})["flow"])
    with pytest.raises(PipelineError, match=r"^param straightdp.flow.stream_clmap: unknown key"):
        sdp.section({"straightdp": {"flow": {"stream_clmap": 16}}})
    # the latent variant's keys are opt-in the same way
    cfg = sdp.section({"straightdp": {"space": "latent", "autoencoder": {"steps": 5}}})
    assert cfg["space"] == "latent" and cfg["autoencoder"] == {"steps": 5}
    assert "space" not in sdp.section({}) and "autoencoder" not in sdp.section({})
    with pytest.raises(PipelineError, match=r"^param straightdp.autoencoder.stpes: unknown key"):
        sdp.section({"straightdp": {"autoencoder": {"stpes": 5}}})


def test_bad_input_is_one_line(world, tmp_path):
    out = {"moments": tmp_path / "m.npz", "ledger": tmp_path / "l.jsonl"}
    inputs = {"data": world["data"], "geometry": world["geometry"]}
    with pytest.raises(PipelineError, match=r"^param straightdp.relase: unknown key"):
        sdp.release_moments(inputs, out, {"straightdp": {"relase": {}}, "run": "released_only_eps1_seed0"})
    with pytest.raises(PipelineError, match=r"^param straightdp.release.rnak: unknown key"):
        sdp.release_moments(inputs, out, {"straightdp": {"release": {"rnak": 3}}, "run": "released_only_eps1_seed0"})
    with pytest.raises(PipelineError, match=r"^param run: STRAIGHTDP run name 'tha_eps1' is not"):
        sdp.release_moments(inputs, out, {"straightdp": TINY, "run": "tha_eps1"})
    with pytest.raises(PipelineError, match=r"row uniform releases no moments"):
        sdp.release_moments(inputs, out, {"straightdp": TINY, "run": "uniform_eps1_seed0"})
    with pytest.raises(PipelineError, match=r"needs input moments"):
        sdp.sample_straightdp({}, {"samples": tmp_path / "s.npz"},
                              {"straightdp": TINY, "run": "released_only_eps1_seed0", "shape": [1, 8, 8]})
    with pytest.raises(PipelineError, match=r"^param n_classes: 2 label rows but the public labels go up to 2"):
        sdp.pretrain_straightdp({"public": world["public"]}, {"model": tmp_path / "f.pt"},
                                {"straightdp": TINY, "n_classes": 2})
    with pytest.raises(PipelineError, match=r"not a STRAIGHTDP geometry file"):
        sdp.release_moments({"data": world["data"], "geometry": world["data"]}, out,
                            {"straightdp": TINY, "run": "released_only_eps1_seed0", "private": PRIVATE,
                             "ledger_binding": BINDING})


def test_the_release_refuses_a_private_set_of_another_size_than_declared(world, tmp_path):
    """N normalises M2's noise (Prop. B.9 on padded databases): it is the config's constant, so a split of
    another size is refused in one line naming both sizes, and a stage without the declaration is refused."""
    out = {"moments": tmp_path / "m.npz", "ledger": tmp_path / "l.jsonl"}
    inputs = {"data": world["data"], "geometry": world["geometry"]}
    run = "released_only_eps1_seed0"
    with pytest.raises(PipelineError, match=r"^stage release_moments: input data holds 150 records but the declared "
                                            r"private size N is 151 \(data.private.n_private_train\)"):
        sdp.release_moments(inputs, out, {"straightdp": TINY, "run": run, "private": {"N": 151, "n_classes": 3},
                                          "ledger_binding": BINDING})
    with pytest.raises(PipelineError, match=r"^stage release_moments: input data has labels outside \[0, 2\)"):
        sdp.release_moments(inputs, out, {"straightdp": TINY, "run": run, "private": {"N": 150, "n_classes": 2},
                                          "ledger_binding": BINDING})
    with pytest.raises(PipelineError, match=r"^stage release_moments: param private = \{N, n_classes\}"):
        sdp.release_moments(inputs, out, {"straightdp": TINY, "run": run})
    assert not out["ledger"].exists()
    # the line records the declared N, and the shape of the release is the declared class count
    rel = release(world, tmp_path, run)
    entry = only_line(rel["ledger"])
    assert entry.extra["N"] == 150 and entry.extra["n_classes"] == 3


def test_the_latent_variant_releases_codes_and_samples_decoded_images(world, tmp_path):
    """straightdp.space: latent: the public autoencoder's codes go through the same geometry, release and
    sampling stages; sample_straightdp with the autoencoder decodes, without it returns the codes."""
    from pipeline.flow import autoencoder as ae

    model, _ = ae.train(load_split(world["public"]).images, ae.AutoencoderSpec(image_size=8, width=4), steps=3,
                        batch_size=32, lr=1e-3, seed=0)
    ae.save(tmp_path / "ae.pt", model, {})
    codes = {}
    for name in ("data", "public"):
        codes[name] = tmp_path / f"{name}_codes.npz"
        ae.encode_split({"split": world[name], "autoencoder": tmp_path / "ae.pt"}, {"codes": codes[name]}, {})
    cfg = {**TINY, "release": {"p": 6, "rank": 3}}
    geo = {"geometry": tmp_path / "g.npz", "horizon": tmp_path / "h.json"}
    sdp.straightdp_geometry({"public": codes["public"]}, geo, {"straightdp": cfg})
    run = "released_only_eps1_seed0"
    rel = {"moments": tmp_path / "m.npz", "ledger": tmp_path / "l.jsonl"}
    sdp.release_moments({"data": codes["data"], "geometry": geo["geometry"]}, rel,
                        {"straightdp": cfg, "run": run, "private": PRIVATE, "ledger_binding": BINDING})
    params = {"straightdp": cfg, "run": run, "shape": [2, 2, 2]}
    sdp.sample_straightdp({"moments": rel["moments"], "autoencoder": tmp_path / "ae.pt"},
                          {"samples": tmp_path / "images.npz"}, params)
    sdp.sample_straightdp({"moments": rel["moments"]}, {"samples": tmp_path / "codes.npz"}, params)
    images, raw = load_split(tmp_path / "images.npz"), load_split(tmp_path / "codes.npz")
    assert images.images.shape == (12, 1, 8, 8) and raw.images.shape == (12, 2, 2, 2)
    assert np.array_equal(images.labels, raw.labels)
    decoded = ae.decode(model, to_model_scale(raw.images))
    assert np.abs(decoded.astype(int) - images.images.astype(int)).max() <= 2  # same codes, up to 8-bit rounding


@pytest.mark.slow  # torchrun and two fresh Python processes
def test_stage2_as_two_data_parallel_processes_releases_the_single_process_flow_and_line(world, tmp_path):
    """``python -m pipeline --nproc 2 train_straightdp`` (two gloo processes): rank 0 writes the one ledger line and
    the model of one process (float summation order); App. D.3's diagnostic counts every example once."""
    import json
    import os
    import subprocess
    import sys

    run = "tha_moments_eps1_seed0"
    cfg = {**TINY, "dpsgd": {**TINY["dpsgd"], "micro_batch": 8}}  # several micro-batches per step to share
    rel = release(world, tmp_path, run)
    inputs = {**{k: world[k] for k in ("data", "public", "init", "geometry", "horizon")},
              "moments": rel["moments"], "release_ledger": rel["ledger"]}
    params = {"straightdp": cfg, "run": run, "device": "cpu", "private": PRIVATE, "ledger_binding": BINDING}
    outs = {}
    for name in ("one", "two"):
        out = {"model": tmp_path / name / "m.pt", "ledger": tmp_path / name / "train.jsonl",
               "metrics": tmp_path / name / "metrics.json"}
        p = {**params, "checkpoint_dir": str(tmp_path / name / "ck")}
        if name == "one":
            with one_thread():
                sdp.train_straightdp(inputs, out, p)
        else:
            cmd = [sys.executable, "-m", "pipeline", "--nproc", "2", "train_straightdp", "--in",
                   *(f"{k}={v}" for k, v in inputs.items()), "--out", *(f"{k}={v}" for k, v in out.items()),
                   "--params", json.dumps(p), "--log", str(tmp_path / "two.log")]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                                 env={**os.environ, "OMP_NUM_THREADS": "1",
                                      "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
            assert res.returncode == 0, (res.stderr[-3000:], (tmp_path / "two.log").read_text()[-3000:])
        outs[name] = out
    one, two = (torch.load(outs[n]["model"], weights_only=True)["state_dict"] for n in ("one", "two"))
    assert all(torch.allclose(one[k], two[k], rtol=1e-4, atol=1e-6) for k in one)
    one_line, two_line = ({k: v for k, v in json.loads(only_line(outs[n]["ledger"]).to_json()).items()
                           if k != "time_utc"} for n in ("one", "two"))
    assert one_line == two_line
    m1, m2 = read_json(outs["one"]["metrics"]), read_json(outs["two"]["metrics"])
    assert (m1["processes"], m2["processes"]) == (1, 2)
    d1, d2 = (m["grad_norms_non_private_diagnostic"]["per_bucket"] for m in (m1, m2))
    assert d1.keys() == d2.keys() and all(d1[b]["steps"] == d2[b]["steps"] and
                                          abs(d1[b]["p50"] - d2[b]["p50"]) <= 1e-4 * d1[b]["p50"] for b in d1)
