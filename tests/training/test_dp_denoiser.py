"""train_dpdm: the released model comes with a ledger line that replays, within budget, for any K."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.privacy.replay import replay_transcripts
from pipeline.io import Split, save_split
from pipeline.models.checkpoint import load_denoiser, read_denoiser_meta
from pipeline.privacy import ledger
from pipeline.stage import PipelineError
from pipeline.training.dp_denoiser import train_dp_denoiser

TINY_UNET = {"block_out_channels": [8, 16], "attention": [False, False], "norm_num_groups": 4}
# eps = 1 keeps the PLD calibration fast (large sigma, narrow privacy-loss support); lr 3e-4 and K 1 are
# what these runs always used (DPDM App. C's lr; the schema's defaults are lr 1e-3, K 4)
BASE = {"epsilon": 1.0, "delta": 1e-5, "batch_size": 8, "steps": 2, "lr": 3e-4, "K": 1, "unet": TINY_UNET,
        "micro_batch": 4, "device": "cpu", "seed": 3, "config_id": "test",
        "ledger_binding": {"run": "r", "experiment": "exp"}, "private": {"N": 40, "n_classes": 3}}


@pytest.fixture(scope="module")
def private_split(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("data") / "private_train.npz"
    save_split(path, Split(rng.integers(0, 256, (40, 1, 8, 8), dtype=np.uint8), np.arange(40) % 3),
               name="private_train", source="test", seed=0)
    return path


def outputs(tmp: Path) -> dict[str, Path]:
    return {"model": tmp / "models" / "dpdm" / "run.pt", "ledger": tmp / "ledger" / "train_dpdm.jsonl",
            "metrics": tmp / "models" / "dpdm" / "run.json"}


def run(tmp, data, **params):
    out = outputs(tmp)
    train_dp_denoiser({"data": data}, out, {**BASE, **params})
    return out


def mechanism_fields(path):
    (_, entry), = ledger.read_ledger(path)
    d = json.loads(entry.to_json())
    d.pop("time_utc")
    return d


@pytest.fixture(scope="module")
def k1_and_k4(private_split, tmp_path_factory):
    return (run(tmp_path_factory.mktemp("k1"), private_split, K=1),
            run(tmp_path_factory.mktemp("k4"), private_split, K=4))


def test_ledger_line_replays_and_certifies_the_target(k1_and_k4):
    out, _ = k1_and_k4
    (claim,) = replay_transcripts([out["ledger"]])
    assert claim["ok"] and claim["stage"] == "train_dpdm"
    assert claim["recomputed_epsilon"] <= BASE["epsilon"]
    meta = read_denoiser_meta(out["model"])
    assert meta["epsilon"] == pytest.approx(claim["claimed_epsilon"])
    assert meta["steps"] == 2 and meta["K"] == 1 and meta["private"]
    (_, entry), = ledger.read_ledger(out["ledger"])
    assert entry.sampling["probability"] == pytest.approx(8 / 40)  # q = batch_size / N, as trained
    assert entry.noise_multiplier == pytest.approx(meta["noise_multiplier"])


def test_noise_multiplicity_leaves_the_ledger_unchanged_but_changes_the_weights(k1_and_k4):
    a, b = k1_and_k4
    assert mechanism_fields(a["ledger"]) == mechanism_fields(b["ledger"])
    wa, wb = (torch.load(o["model"], weights_only=True)["state_dict"] for o in (a, b))
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)  # K really entered the training


def test_the_metrics_hold_no_training_loss(k1_and_k4):
    metrics = json.loads(k1_and_k4[0]["metrics"].read_text())
    assert not any("loss" in k for k in metrics)
    state = torch.load(k1_and_k4[0]["model"].parents[2] / "checkpoints" / "train_dpdm" / "run" / "state.pt",
                       weights_only=False)
    assert all(np.isnan(state["losses"]))


def test_rerun_resumes_from_the_finished_state_to_the_same_model(private_split, tmp_path):
    out = run(tmp_path, private_split, parameterisation="vpred")
    first = torch.load(out["model"], weights_only=True)["state_dict"]
    out = run(tmp_path, private_split, parameterisation="vpred", checkpoint_every_s=7)  # not part of the hash
    assert json.loads(out["metrics"].read_text())["resumed_from"] == 2
    second = torch.load(out["model"], weights_only=True)["state_dict"]
    assert all(torch.equal(first[k], second[k]) for k in first)
    net = load_denoiser(out["model"])
    x = torch.zeros(2, 1, 8, 8)
    assert net(x, torch.tensor([0.5, 5.0]), torch.tensor([0, 3])).shape == x.shape  # label 3 = the null class


def test_init_from_a_public_denoiser_copies_matching_weights(private_split, tmp_path):
    from pipeline.models.checkpoint import save_denoiser
    from pipeline.models.edm import EDMPrecond
    from pipeline.models.unet import UNetSpec, build_unet
    from pipeline.training.dp_denoiser import init_from_public

    spec = UNetSpec(image_size=8, block_out_channels=(8, 16), attention=(False, False), norm_num_groups=4,
                    num_classes=3)
    torch.manual_seed(5)
    public = EDMPrecond(build_unet(spec))
    save_denoiser(tmp_path / "public.pt", public, unet=spec, precond="edm")
    torch.manual_seed(6)
    fresh = EDMPrecond(build_unet(spec))
    info = init_from_public(fresh, tmp_path / "public.pt")
    assert info["fresh"] == [] and info["skipped"] == []
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), public.state_dict().values()))


@pytest.mark.parametrize("params,match", [({"epsilon": None}, "epsilon"), ({"K": 0}, "K must be"),
                                          ({"parameterisation": "ddpm"}, "parameterisation"),
                                          ({"bacth_size": 3}, "unknown param 'bacth_size'"),
                                          ({"batch_size": 41}, "exceeds the 40 private records"),
                                          # q = batch / N: N is the declared size, and a split of another is refused
                                          ({"private": {"N": 41, "n_classes": 3}},
                                           r"input data holds 40 records but the declared private size N is 41"),
                                          ({"ledger_binding": None}, r"param ledger_binding = \{run, experiment\}"),
                                          ({"clipping": "hooks"},
                                           r"param clipping must be one of vmap, ghost, auto, got 'hooks'"),
                                          ({"draws": "philox"},
                                           r"param draws must be one of stream, counter, got 'philox'")])
def test_bad_params_are_one_line_errors(private_split, tmp_path, params, match):
    p = {**BASE, **params}
    if p.get("epsilon") is None:
        p.pop("epsilon")
    with pytest.raises(PipelineError, match=match):
        train_dp_denoiser({"data": private_split}, {"model": tmp_path / "m.pt", "ledger": tmp_path / "l.jsonl",
                                              "metrics": tmp_path / "m.json"}, p)


def test_a_run_interrupted_after_a_checkpoint_resumes_to_the_uninterrupted_model(k1_and_k4, private_split,
                                                                                 tmp_path, monkeypatch):
    from pipeline.training import loop

    original = loop.run_training

    def interrupted(**kw):
        step_fn = kw["step_fn"]

        def step(i):
            if i == 1:  # step 0 is done and checkpointed (checkpoint_every_s is tiny)
                raise KeyboardInterrupt("simulated kill")
            return step_fn(i)

        return original(**{**kw, "step_fn": step})

    monkeypatch.setattr(loop, "run_training", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, private_split, K=1, checkpoint_every_s=1e-9)
    monkeypatch.setattr(loop, "run_training", original)
    assert torch.load(tmp_path / "checkpoints" / "train_dpdm" / "run" / "state.pt", weights_only=False)["step"] == 1
    out = run(tmp_path, private_split, K=1)
    assert json.loads(out["metrics"].read_text())["resumed_from"] == 1
    reference = torch.load(k1_and_k4[0]["model"], weights_only=True)["state_dict"]
    resumed = torch.load(out["model"], weights_only=True)["state_dict"]
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)  # same noise, same batches
    assert mechanism_fields(out["ledger"]) == mechanism_fields(k1_and_k4[0]["ledger"])


def test_sigterm_mid_run_saves_the_state_and_the_rerun_releases_the_uninterrupted_model_and_ledger(
        k1_and_k4, private_split, tmp_path, monkeypatch):
    from pipeline.training import loop

    original = loop.run_training

    def terminated(**kw):
        step_fn = kw["step_fn"]

        def step(i):
            if i == 0:  # SLURM's SIGTERM arrives during the first private step
                signal.raise_signal(signal.SIGTERM)
            return step_fn(i)

        return original(**{**kw, "step_fn": step})

    monkeypatch.setattr(loop, "run_training", terminated)
    received = []  # a loop that ignored the signal fails here instead of killing the test run
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        with pytest.raises(loop.TrainingInterrupted) as info:
            run(tmp_path, private_split, K=1, checkpoint_every_s=1e9)  # no timed checkpoint: only the signal saves
    finally:
        signal.signal(signal.SIGTERM, previous)
    monkeypatch.setattr(loop, "run_training", original)
    assert received == []
    state = tmp_path / "checkpoints" / "train_dpdm" / "run" / "state.pt"
    assert info.value.exit_code == 143 and str(state) in str(info.value)
    assert torch.load(state, weights_only=False)["step"] == 1  # the step in flight finished, then was saved
    assert not (tmp_path / "models" / "dpdm" / "run.pt").exists() and not (tmp_path / "ledger").exists()
    out = run(tmp_path, private_split, K=1)
    assert json.loads(out["metrics"].read_text())["resumed_from"] == 1
    reference = torch.load(k1_and_k4[0]["model"], weights_only=True)["state_dict"]
    resumed = torch.load(out["model"], weights_only=True)["state_dict"]
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)
    # one ledger line for the planned T steps, however many processes ran them
    assert mechanism_fields(out["ledger"]) == mechanism_fields(k1_and_k4[0]["ledger"])


def test_partial_fine_tuning_moves_only_the_trainable_weights_under_the_same_mechanism(private_split, tmp_path):
    from pipeline.models.checkpoint import save_denoiser
    from pipeline.models.edm import EDMPrecond
    from pipeline.models.unet import UNetSpec, build_unet

    spec = UNetSpec(image_size=8, block_out_channels=(8, 16), attention=(False, False), norm_num_groups=4,
                    num_classes=3)
    torch.manual_seed(5)
    save_denoiser(tmp_path / "public.pt", EDMPrecond(build_unet(spec)), unet=spec, precond="edm")
    public = load_denoiser(tmp_path / "public.pt").state_dict()
    patterns = ["unet.class_embedding.*", "unet.conv_out.*"]
    outs = {}
    for name, trainable in (("part", patterns), ("all", None)):
        out = {"model": tmp_path / name / "m.pt", "ledger": tmp_path / name / "l.jsonl",
               "metrics": tmp_path / name / "m.json"}
        train_dp_denoiser({"data": private_split, "init": tmp_path / "public.pt"}, out,
                   {**BASE, "ema_decay": 0.0, "trainable": trainable})
        outs[name] = out
    released = load_denoiser(outs["part"]["model"]).state_dict()
    moved = {k for k in public if not torch.equal(public[k], released[k])}
    assert moved and all(k.startswith(("unet.class_embedding.", "unet.conv_out.")) for k in moved)
    meta = read_denoiser_meta(outs["part"]["model"])
    assert meta["trainable"] == patterns and 0 < meta["n_trainable"] < meta_all_trainable(outs["all"])
    # the mechanism (and so eps) does not depend on which coordinates are noised
    assert mechanism_fields(outs["part"]["ledger"]) == mechanism_fields(outs["all"]["ledger"])


def meta_all_trainable(out) -> int:
    return read_denoiser_meta(out["model"])["n_trainable"]


def test_a_trainable_pattern_that_matches_nothing_is_one_line(private_split, tmp_path):
    with pytest.raises(PipelineError, match="trainable pattern 'unet.nothing.*' matches no parameter") as err:
        run(tmp_path, private_split, trainable=["unet.nothing.*"])
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------- data parallel

#: several micro-batches per step to share, enough steps for a timed checkpoint before the kill
DATA_PARALLEL = {"steps": 12, "K": 2, "micro_batch": 2, "checkpoint_every_s": 0.2,
                 "unet": {**TINY_UNET, "attention": [False, True]}}


def command(data: Path, out: dict[str, Path], log: Path) -> list[str]:
    return [sys.executable, "-m", "pipeline", "--nproc", "2", "train_dpdm", "--in", f"data={data}", "--out",
            *(f"{k}={v}" for k, v in out.items()), "--params", json.dumps({**BASE, **DATA_PARALLEL}),
            "--log", str(log)]


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def _processes_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.slow  # starts torchrun and two fresh Python processes, twice
def test_two_processes_killed_mid_way_resume_to_the_single_process_model_and_ledger_line(private_split, tmp_path):
    """``python -m pipeline --nproc 2 train_dpdm`` (torchrun, two gloo processes), killed mid-way (every process,
    SIGKILL) and rerun: it resumes from rank 0's last checkpoint and releases the single process's model (float
    summation order) and ledger line, written once by rank 0."""
    one_process = run(tmp_path / "one", private_split, **DATA_PARALLEL)
    out = outputs(tmp_path / "two")
    log = tmp_path / "two" / "train.log"
    state = tmp_path / "two" / "checkpoints" / "train_dpdm" / "run" / "state.pt"
    proc = subprocess.Popen(command(private_split, out, log), env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not state.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before its first checkpoint"
    # the whole job dies at once (a node failure): torchrun's agent and both ranks, no state saved on the way out
    for pid in _processes_with(str(tmp_path / "two")):
        os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=60)
    saved = torch.load(state, weights_only=False)["step"]
    assert 0 < saved < DATA_PARALLEL["steps"] and not out["model"].exists()
    res = subprocess.run(command(private_split, out, log), env=env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, (res.stderr[-3000:], log.read_text()[-3000:])
    metrics = json.loads(out["metrics"].read_text())
    assert metrics["resumed_from"] >= saved and metrics["processes"] == 2
    assert json.loads(one_process["metrics"].read_text())["processes"] == 1
    # the single process's model (float summation order) and ledger line, which rank 0 alone wrote
    w1, w2 = (torch.load(o["model"], weights_only=True)["state_dict"] for o in (one_process, out))
    assert all(torch.allclose(w1[k], w2[k], rtol=1e-4, atol=1e-6) for k in w1)
    assert mechanism_fields(out["ledger"]) == mechanism_fields(one_process["ledger"])
    assert sorted(p.name for p in out["model"].parent.iterdir()) == ["run.json", "run.pt"]
    # rank 1 logged beside rank 0's log
    assert "process 1 of 2" in log.read_text()
    assert "process 2 of 2" in (tmp_path / "two" / "train.log.rank1").read_text()


def test_unet_init_takes_the_public_denoisers_own_architecture_and_copies_every_tensor(private_split, tmp_path):
    # DP-Diffusion fine-tunes the public model itself (a trained or an imported one): nothing starts fresh
    from pipeline.models.checkpoint import save_denoiser
    from pipeline.models.edm import EDMPrecond
    from pipeline.models.unet import UNetSpec, build_unet

    spec = UNetSpec(image_size=8, block_out_channels=(8, 8), attention=(False, True), norm_num_groups=4,
                    num_classes=3)
    torch.manual_seed(5)
    save_denoiser(tmp_path / "public.pt", EDMPrecond(build_unet(spec)), unet=spec, precond="edm")
    out = outputs(tmp_path)
    train_dp_denoiser({"data": private_split, "init": tmp_path / "public.pt"}, out,
               {**BASE, "unet": "init", "K": 2, "augment": {"max_shift": 1, "flip": False}})
    metrics = json.loads(out["metrics"].read_text())
    assert metrics["init_fresh_tensors"] == [] and metrics["unet"] == spec.to_json()
    assert metrics["augment"] == {"max_shift": 1, "flip": False} and metrics["class_conditional"]
    # the views change the released model, not the mechanism
    plain = outputs(tmp_path / "plain")
    train_dp_denoiser({"data": private_split, "init": tmp_path / "public.pt"}, plain, {**BASE, "unet": "init", "K": 2})
    assert mechanism_fields(out["ledger"]) == mechanism_fields(plain["ledger"])
    a, b = load_denoiser(out["model"]).state_dict(), load_denoiser(plain["model"]).state_dict()
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_unet_init_without_a_fitting_public_denoiser_is_one_line(private_split, tmp_path):
    from pipeline.models.checkpoint import save_denoiser
    from pipeline.models.edm import EDMPrecond
    from pipeline.models.unet import UNetSpec, build_unet

    out = outputs(tmp_path)
    with pytest.raises(PipelineError, match="param unet 'init' needs --in init"):
        train_dp_denoiser({"data": private_split}, out, {**BASE, "unet": "init"})
    spec = UNetSpec(image_size=16, block_out_channels=(8, 8), attention=(False, False), norm_num_groups=4)
    save_denoiser(tmp_path / "big.pt", EDMPrecond(build_unet(spec)), unet=spec, precond="edm")
    with pytest.raises(PipelineError, match=r"a 1x16\^2 model with 0 classes, the private split is 1x8\^2 with 3"):
        train_dp_denoiser({"data": private_split, "init": tmp_path / "big.pt"}, out, {**BASE, "unet": "init"})
    with pytest.raises(PipelineError, match="param augment must be"):
        train_dp_denoiser({"data": private_split}, out, {**BASE, "augment": {"max_shift": -1}})


def test_a_prior_release_of_the_same_run_is_composed_into_the_calibration(private_split, tmp_path):
    """PrivImage: the query's line is input prior; sigma grows so the composition meets the target, the run's eps is
    the composition's, the DP-SGD line claims its own event only. A prior of another run or other data is refused."""
    from pipeline.io import read_json
    from pipeline.privacy import semantic_histogram as sh
    from pipeline.privacy.certify import composed_entry, recompute

    sha = read_json(private_split.with_suffix(".json"))["sha256"]
    query = sh.calibrate(target_epsilon=0.3, delta=1e-5, k=1)
    prior = tmp_path / "query.jsonl"
    ledger.append_entry(prior, sh.ledger_entry(query, stage="privimage_select", config_id="t", seed=3),
                        ledger.Binding(run="r", experiment="exp", data_sha256=sha))
    alone = run(tmp_path / "alone", private_split)
    out = outputs(tmp_path / "composed")
    train_dp_denoiser({"data": private_split, "prior": prior}, out, BASE)
    line, = [e for _, e in ledger.read_ledger(out["ledger"])]
    alone_line, = [e for _, e in ledger.read_ledger(alone["ledger"])]
    assert line.noise_multiplier > alone_line.noise_multiplier and line.extra["composed_with"] == [sh.MECHANISM]
    both = recompute(composed_entry([e for _, e in ledger.read_ledger(prior)] + [line]))
    metrics = json.loads(out["metrics"].read_text())
    assert both <= 1.0 and metrics["epsilon"] == pytest.approx(both, rel=1e-3) and line.claimed_epsilon < both

    other = tmp_path / "other.jsonl"
    ledger.append_entry(other, sh.ledger_entry(query, stage="privimage_select", config_id="t", seed=3),
                        ledger.Binding(run="another", experiment="exp", data_sha256=sha))
    with pytest.raises(PipelineError, match="input prior .*bound to run 'another'"):
        train_dp_denoiser({"data": private_split, "prior": other}, outputs(tmp_path / "bad"), BASE)
    # a line whose event was edited to a larger sigma than its parameters say is refused before any calibration
    import dataclasses
    edited = tmp_path / "edited.jsonl"
    line = sh.ledger_entry(query, stage="privimage_select", config_id="t", seed=3)
    louder = sh.SemanticQueryPlan(query.sigma * 10, 1, 1e-5)
    ledger.append_entry(edited, dataclasses.replace(
        line, event=ledger.event_to_dict(louder.event()), noise_multiplier=louder.sigma, noise_std=louder.noise_std),
        ledger.Binding(run="r", experiment="exp", data_sha256=sha))
    with pytest.raises(PipelineError, match="input prior: .*does not match"):
        train_dp_denoiser({"data": private_split, "prior": edited}, outputs(tmp_path / "bad2"), BASE)


def test_a_sigma_range_restricts_the_noise_levels_drawn_and_is_recorded(private_split, tmp_path):
    from pipeline.models.edm import edm_sigma_sampler
    from pipeline.training.dp_denoiser import DPDenoiserConfig

    cfg = DPDenoiserConfig.from_params({**BASE, "sigma_range": [1.0, None]})
    draws = cfg.sigma_sampler(edm_sigma_sampler())(2000, torch.Generator().manual_seed(0))
    assert cfg.sigma_range == (1.0, None) and draws.min() >= 1.0
    default = DPDenoiserConfig.from_params(BASE)
    assert default.sigma_range is None and default.sigma_sampler("the parameterisation's") == "the parameterisation's"
    out = run(tmp_path, private_split, sigma_range=[0.0, 1.0])
    assert read_denoiser_meta(out["model"])["sigma_range"] == [0.0, 1.0]
    # a run without one keeps its meta (and its params hash) as before the option
    assert "sigma_range" not in read_denoiser_meta(run(tmp_path / "all", private_split)["model"])


@pytest.mark.parametrize("params,match", [
    ({"sigma_range": [2.0, 1.0]}, r"param sigma_range must be \[lo, hi\] with 0 <= lo < hi"),
    ({"sigma_range": [1.0]}, r"param sigma_range must be \[lo, hi\] \(hi may be null\)"),
    ({"sigma_range": [0.0, 1.0], "parameterisation": "vp"}, "null unless parameterisation is edm")])
def test_a_bad_sigma_range_is_one_line(private_split, tmp_path, params, match):
    with pytest.raises(PipelineError, match=match):
        run(tmp_path, private_split, **params)


def test_a_second_phase_from_a_private_model_must_compose_its_transcript(private_split, tmp_path):
    """DP-Promise: phase II starts from phase I's model; without phase I's transcript as prior the run is refused,
    with it sigma is calibrated so both phases composed meet the target."""
    from pipeline.privacy.certify import composed_entry, recompute

    one = run(tmp_path / "one", private_split, epsilon=0.5, sigma_range=[1.0, None])
    two_params = {**BASE, "unet": "init", "sigma_range": [0.0, 1.0]}
    with pytest.raises(PipelineError, match=r"input init .* is a private model .* give its transcript as input prior"):
        train_dp_denoiser({"data": private_split, "init": one["model"]}, outputs(tmp_path / "bad"), two_params)
    out = outputs(tmp_path / "two")
    train_dp_denoiser({"data": private_split, "init": one["model"], "prior": one["ledger"]}, out, two_params)
    first, = [e for _, e in ledger.read_ledger(one["ledger"])]
    second, = [e for _, e in ledger.read_ledger(out["ledger"])]
    both = recompute(composed_entry([first, second]))
    assert both <= 1.0 and second.extra["composed_with"] == ["dpsgd"]
    assert json.loads(out["metrics"].read_text())["epsilon"] == pytest.approx(both, rel=1e-3)
    # each line claims its own phase only; the run's eps is their composition
    assert first.claimed_epsilon <= 0.5 and second.claimed_epsilon < both


def test_a_private_init_composes_its_own_line_not_another_dpsgd_line_on_the_same_data(private_split, tmp_path):
    """The prior of a private init is the init's own line (the mechanism, stage, split, seed and config its checkpoint
    records): a DP-SGD line of another run on the same split (here another config's smaller eps, bound to this run's
    name so it passes the prior's run check) is refused, so is this run's own line beside another run's model; the
    init's own line is accepted and the run composes exactly it."""
    import re

    from pipeline.privacy.certify import composed_entry, recompute

    phase_one = {"epsilon": 0.5, "sigma_range": [1.0, None]}
    own = run(tmp_path / "own", private_split, **phase_one)
    other = run(tmp_path / "other", private_split, **{**phase_one, "epsilon": 0.2}, seed=4, config_id="another")
    two_params = {**BASE, "unet": "init", "sigma_range": [0.0, 1.0]}

    def refusal(prior: Path, init: Path) -> str:
        return rf"input prior {re.escape(str(prior))} holds no line of input init {re.escape(str(init))}'s own training"

    with pytest.raises(PipelineError, match=refusal(other["ledger"], own["model"]) + r" \(.*seed=3.*\)") as refused:
        train_dp_denoiser({"data": private_split, "init": own["model"], "prior": other["ledger"]},
                   outputs(tmp_path / "bad"), two_params)
    assert "\n" not in str(refused.value)
    with pytest.raises(PipelineError, match=refusal(own["ledger"], other["model"])):
        train_dp_denoiser({"data": private_split, "init": other["model"], "prior": own["ledger"]},
                   outputs(tmp_path / "bad2"), two_params)
    out = outputs(tmp_path / "two")
    train_dp_denoiser({"data": private_split, "init": own["model"], "prior": own["ledger"]}, out, two_params)
    first, = [e for _, e in ledger.read_ledger(own["ledger"])]
    second, = [e for _, e in ledger.read_ledger(out["ledger"])]
    both = recompute(composed_entry([first, second]))
    assert json.loads(out["metrics"].read_text())["epsilon"] == pytest.approx(both, rel=1e-3)
