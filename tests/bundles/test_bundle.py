"""A certified bundle of a private run: exported from the run's own files, verified end to end, and refused in one
line when its weights, a transcript or its card is altered after export."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.bundles.bundle import CERTIFICATE, BundleError, export_bundle, file_hashes, verify
from pipeline.bundles.sample import sample
from pipeline.io import Split, load_split, save_split
from pipeline.sampling.denoiser_stage import sample_denoiser
from pipeline.training.dp_denoiser import train_dp_denoiser

RUN = "edm_eps1_K1_seed3"
TRANSCRIPT = f"train_dpdm_{RUN}"
SAMPLER = {"name": "stochastic_ddim", "steps": 3, "eta": 1.0}
TRAIN = {"epsilon": 1.0, "delta": 1e-5, "batch_size": 8, "steps": 2, "lr": 3e-4, "K": 1, "micro_batch": 4,
         "unet": {"block_out_channels": [8, 16], "attention": [False, False], "norm_num_groups": 4},
         "device": "cpu", "seed": 3, "config_id": "test", "ledger_binding": {"run": RUN, "experiment": "tiny"},
         "private": {"N": 40, "n_classes": 3}}


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    """A tiny DPDM run's own files: the private split, the model, its ledger line, its samples and their scores."""
    tmp = tmp_path_factory.mktemp("run")
    rng = np.random.default_rng(0)
    data = tmp / "data" / "private_train.npz"
    save_split(data, Split(rng.integers(0, 256, (40, 1, 8, 8), dtype=np.uint8), np.arange(40) % 3),
               name="private_train", source="test", seed=0)
    files = {"data": data, "model": tmp / "models" / f"{RUN}.pt", "ledger": tmp / "ledger" / f"{TRANSCRIPT}.jsonl",
             "samples": tmp / "samples" / f"{RUN}.npz", "metrics": tmp / "eval" / "metrics.json"}
    train_dp_denoiser({"data": data}, {"model": files["model"], "ledger": files["ledger"],
                                "metrics": tmp / "train.json"}, TRAIN)
    sample_denoiser({"denoiser": files["model"]}, {"samples": files["samples"]},
                {"sampler": SAMPLER, "n_samples": 12, "seed": 3, "batch_size": 12, "device": "cpu"})
    files["metrics"].parent.mkdir(parents=True)
    files["metrics"].write_text(json.dumps({"fid": 321.5, "acc_cnn": 0.4, "n_samples": 12}))
    return files


#: what the tiny run's configuration ran (TRAIN): the declared N, the batch, T and the clip; sigma to eps 1
CONFIGURED = {"params": [{"sampling.n": 40, "extra.expected_batch_size": 8, "count": 2, "extra.max_grad_norm": 1.0}],
              "epsilon_target": [1.0], "after": [], "rtol": 1e-3, "phase": "", "prior_lines": [[]]}


def registered(params: dict, target: float | None = None) -> dict:
    """The rest of a transcript's registration: its line's configured ``params`` and calibration ``target``."""
    return {"params": [params], "epsilon_target": [target], "after": [], "rtol": 1e-3, "phase": "",
            "prior_lines": [[]]}


def export(files: dict[str, Path], out: Path, **params) -> Path:
    expected = {TRANSCRIPT: {"claims": 1, "run": RUN, "stage": "train_dpdm", "delta": 1e-5, "data": str(files["data"]),
                             "configuration": False, **CONFIGURED}}
    export_bundle({"model": files["model"], "samples": files["samples"], "metrics": files["metrics"],
                   f"ledger_{TRANSCRIPT}": files["ledger"]}, {"bundle": out},
                  {"method": "dpdm", "run": RUN, "experiment": "tiny", "kind": "model", "dataset": "tiny digits",
                   "epsilon_target": 1.0, "expected": expected,
                   "sampling": {"sampler": "dpdm", "settings": SAMPLER, "seed": 3, "batch_size": 12, "n_samples": 12},
                   "covers": ["DP-SGD training on the private split"], "not_covered": ["public pretraining"],
                   **params})
    return out


@pytest.fixture(scope="module")
def bundle(run_files, tmp_path_factory):
    return export(run_files, tmp_path_factory.mktemp("bundles") / "dpdm" / RUN)


def copy(bundle: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(bundle, tmp_path / "copy"))


def rehash(root: Path) -> None:
    """What a forger who also edits the certificate does: every file's sha256 made current."""
    cert = json.loads((root / CERTIFICATE).read_text())
    cert["files"] = file_hashes(root)
    (root / CERTIFICATE).write_text(json.dumps(cert))


def test_a_bundle_verifies_and_states_the_runs_certified_claim(bundle, run_files):
    from huggingface_hub import ModelCard

    cert = verify(bundle)
    assert cert["kind"] == "model" and cert["run"] == RUN and cert["ledger_run"] == RUN
    assert 0 < cert["epsilon"] <= 1.0 and cert["delta"] == 1e-5 and cert["accountant"]
    assert cert["data_sha256"] == json.loads(run_files["data"].with_suffix(".json").read_text())["sha256"]
    assert {"weights/denoiser.json", "samples.npz", "samples.png", "README.md", f"ledger/{TRANSCRIPT}.jsonl",
            "replay.json", "sampling.json", "metrics.json"} <= set(cert["files"])
    assert not list(bundle.rglob("*.pt")) and not list(bundle.rglob("*.pkl"))
    card = ModelCard.load(bundle / "README.md")
    assert card.data.differential_privacy["epsilon"] == cert["epsilon"]
    assert [(r.metric_type, r.metric_value, r.dataset_split) for r in card.data.eval_results] == [
        ("fid", 321.5, "test"), ("acc_cnn", 0.4, "test")]
    assert json.loads((bundle / "replay.json").read_text())["all_ok"]


def test_the_bundle_samples_the_runs_own_samples(bundle, run_files):
    own = load_split(run_files["samples"])
    again = sample(bundle, 12)
    assert np.array_equal(again.images, own.images) and np.array_equal(again.labels, own.labels)
    shipped = np.load(bundle / "samples.npz", allow_pickle=False)
    assert np.array_equal(shipped["images"], own.images)
    other = sample(bundle, 12, seed=4)
    assert not np.array_equal(other.images, own.images)


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _weights_file(root: Path) -> Path:
    (f,) = (root / "weights" / "unet").glob("*.safetensors")
    return f


def _lower_the_claim(root: Path) -> None:
    path = root / "ledger" / f"{TRANSCRIPT}.jsonl"
    line = json.loads(path.read_text())
    line["claimed_epsilon"] = line["claimed_epsilon"] / 4
    path.write_text(json.dumps(line, sort_keys=True) + "\n")


def _lower_the_cards_eps(root: Path) -> None:
    card = root / "README.md"
    text = card.read_text()
    cert = json.loads((root / CERTIFICATE).read_text())
    assert f"epsilon: {cert['epsilon']}" in text
    card.write_text(text.replace(f"epsilon: {cert['epsilon']}", "epsilon: 0.01", 1))


def _halve_the_steps(root: Path) -> None:
    """Issue #54's forgery 3: T halved with the event and the claim restated to match (the line's rebuild passes)."""
    import dataclasses

    from pipeline.privacy import dpsgd_plan, ledger, rebuild
    from pipeline.privacy.certify import recompute

    path = root / "ledger" / f"{TRANSCRIPT}.jsonl"
    (entry,) = [e for _, e in ledger.read_ledger(path)]
    plan = dataclasses.replace(rebuild.dpsgd_plan(entry), steps=entry.count // 2)
    forged = dataclasses.replace(entry, event=ledger.event_to_dict(plan.event()), count=plan.steps)
    rebuild.check(forged)
    path.write_text(dataclasses.replace(forged, claimed_epsilon=recompute(forged)).to_json() + "\n")


@pytest.mark.parametrize("tamper, rehashed, match", [
    (lambda r: _flip_a_byte(_weights_file(r)), False, r"weights/unet/.*differs from the certificate's sha256"),
    (_lower_the_claim, False, rf"ledger/{TRANSCRIPT}.jsonl differs from the certificate's sha256"),
    (_lower_the_claim, True, "replay FAILED"),
    (_lower_the_cards_eps, False, "README.md differs from the certificate's sha256"),
    (_lower_the_cards_eps, True, r"differential_privacy.epsilon \(0.01\) is not the certificate's"),
    (lambda r: (r / "extra.bin").write_bytes(b"x"), False, "extra.bin is not in the certificate"),
    (_halve_the_steps, True, "count is 1, the configuration ran 2"),
], ids=["weights", "transcript", "transcript-rehashed", "card", "card-rehashed", "added-file", "steps-halved"])
def test_an_altered_bundle_is_refused_in_one_line(bundle, tmp_path, tamper, rehashed, match):
    root = copy(bundle, tmp_path)
    tamper(root)
    if rehashed:
        rehash(root)
    with pytest.raises(BundleError, match=match) as refused:
        verify(root)
    assert "\n" not in str(refused.value)


def test_the_command_line_refuses_an_altered_bundle_in_one_line_and_exits_1(bundle, tmp_path, repo):
    root = copy(bundle, tmp_path)
    _flip_a_byte(_weights_file(root))
    res = subprocess.run([sys.executable, "-m", "pipeline", "verify_bundle", str(bundle), str(root)], cwd=repo,
                         capture_output=True, text=True)
    assert res.returncode == 1 and res.stdout.startswith(f"ok {bundle}"), res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"FAILED {root}: weights/unet/") and "differs from the certificate's sha256" in line


def test_weights_of_another_seed_are_refused_even_rehashed(bundle, tmp_path):
    root = copy(bundle, tmp_path)
    spec = json.loads((root / "weights" / "denoiser.json").read_text())
    spec["meta"]["seed"] = 4
    (root / "weights" / "denoiser.json").write_text(json.dumps(spec))
    rehash(root)
    with pytest.raises(BundleError, match="trained with seed 4"):
        verify(root)


#: what a forger of a bundle's scope writes instead: the caveat about public pretraining folded into the covers, or
#: dropped from what is not covered
FORGED_SCOPE = {"covers": ["DP-SGD training on the private split and the public pretraining"], "not_covered": []}


def _rewrite_the_certificates(key: str):
    """The certificate's statement of ``key`` rewritten (the certificate lists no sha256 of itself)."""
    def tamper(root: Path) -> None:
        cert = json.loads((root / CERTIFICATE).read_text())
        cert[key] = FORGED_SCOPE[key]
        (root / CERTIFICATE).write_text(json.dumps(cert))
    return tamper


def _rewrite_the_cards_list(key: str):
    """The card body's list of ``key`` (what a reader of the card reads) rewritten; the metadata block kept."""
    from pipeline.bundles.card import SCOPE_HEADINGS

    def tamper(root: Path) -> None:
        card = root / "README.md"
        head, sep, body = card.read_text().partition(f"{SCOPE_HEADINGS[key]}\n\n")
        listed = body[:body.index("\n\n")]
        forged = "\n".join(f"- {c}" for c in FORGED_SCOPE[key])
        card.write_text(head + sep + forged + body[len(listed):])
    return tamper


@pytest.mark.parametrize("key", ["covers", "not_covered"])
@pytest.mark.parametrize("tamper, rehashed, match", [
    (_rewrite_the_certificates, False, r"README.md: the card's differential_privacy.{key} \(.*\) is not the "
                                       r"certificate's \("),
    (_rewrite_the_cards_list, False, "README.md differs from the certificate's sha256"),
    (_rewrite_the_cards_list, True, r"README.md: the card's list under .* is not the certificate's {key} \("),
], ids=["certificate", "card", "card-rehashed"])
def test_a_rewritten_statement_of_what_the_eps_covers_is_refused_in_one_line(bundle, tmp_path, key, tamper,
                                                                             rehashed, match):
    """What a bundle's eps covers and does not is part of its claim: rewriting it in the certificate or the card
    (with the card's sha256 made current) is refused, naming the field."""
    root = copy(bundle, tmp_path)
    tamper(key)(root)
    if rehashed:
        rehash(root)
    with pytest.raises(BundleError, match=match.format(key=key)) as refused:
        verify(root)
    assert "\n" not in str(refused.value)


def test_the_command_line_refuses_a_rewritten_scope_naming_the_field(bundle, tmp_path, repo):
    roots = {}
    for key in ("covers", "not_covered"):
        roots[key] = copy(bundle, tmp_path / key)
        _rewrite_the_certificates(key)(roots[key])
    res = subprocess.run([sys.executable, "-m", "pipeline", "verify_bundle", *map(str, roots.values())], cwd=repo,
                         capture_output=True, text=True)
    assert res.returncode == 1 and not res.stdout, res.stderr
    lines = res.stderr.strip().splitlines()
    assert [line.split(": the card's ")[0] for line in lines] == [f"FAILED {r}/README.md" for r in roots.values()]
    assert [line.split(": the card's ")[1].split(" ")[0] for line in lines] == [
        "differential_privacy.covers", "differential_privacy.not_covered"]


def test_verify_and_sample_from_the_command_line(bundle, tmp_path, repo):
    res = subprocess.run([sys.executable, "-m", "pipeline", "verify_bundle", str(bundle)], cwd=repo,
                         capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.startswith("ok ") and f"dpdm/{RUN}" in res.stdout, res.stderr
    out = tmp_path / "x.npz"
    res = subprocess.run([sys.executable, "-m", "pipeline", "sample_bundle", str(bundle), "--n", "6", "--out",
                          str(out)], cwd=repo, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert load_split(out).images.shape == (6, 1, 8, 8)


# --------------------------------------------------------------------------- a STRAIGHTDP run: two composed lines

from tests.methods.straightdp.test_stages import PRIVATE, TINY, world  # noqa: E402,F401 (the tiny STRAIGHTDP world)

SDP_RUN = "tha_moments_eps1_seed0"


@pytest.fixture(scope="module")
def straightdp_bundle(world, tmp_path_factory):  # noqa: F811 -- the fixture imported above
    """A tiny STRAIGHTDP run (Stage 1 release, Stage 2 THA DP-SGD distilled from it), its samples, its bundle."""
    from pipeline.config import schema_defaults
    from pipeline.methods.straightdp import stages as sdp
    from tests.conftest import one_thread

    tmp, binding = tmp_path_factory.mktemp("sdp"), {"run": SDP_RUN, "experiment": "tiny"}
    rel = {"moments": tmp / "release.npz", "ledger": tmp / f"straightdp_release_{SDP_RUN}.jsonl"}
    common = {"straightdp": TINY, "run": SDP_RUN, "private": PRIVATE, "ledger_binding": binding}
    out = {"model": tmp / "model.pt", "ledger": tmp / f"straightdp_train_{SDP_RUN}.jsonl", "metrics": tmp / "t.json"}
    with one_thread():
        sdp.release_moments({"data": world["data"], "geometry": world["geometry"]}, rel, common)
        sdp.train_straightdp({**{k: world[k] for k in ("data", "public", "init", "geometry", "horizon")},
                              "moments": rel["moments"], "release_ledger": rel["ledger"]}, out,
                             {**common, "device": "cpu", "checkpoint_dir": str(tmp / "ck")})
        sdp.sample_straightdp({"model": out["model"]}, {"samples": tmp / "samples.npz"},
                              {"straightdp": TINY, "device": "cpu", "run": SDP_RUN, "shape": [1, 8, 8]})
    (tmp / "metrics.json").write_text(json.dumps({"fid": 400.0}))
    line = {"claims": 1, "run": SDP_RUN, "delta": 1e-5, "data": str(world["data"]), "configuration": False,
            **registered({"count": 1})}
    guidance = {**schema_defaults("straightdp", "sampling"), **TINY["sampling"]}["guidance"]
    bundle = tmp / "bundles" / "straightdp" / SDP_RUN
    export_bundle({"model": out["model"], "samples": tmp / "samples.npz", "metrics": tmp / "metrics.json",
                   f"ledger_straightdp_release_{SDP_RUN}": rel["ledger"],
                   f"ledger_straightdp_train_{SDP_RUN}": out["ledger"]},
                  {"bundle": bundle},
                  {"method": "straightdp", "run": SDP_RUN, "experiment": "tiny", "kind": "model", "dataset": "blobs",
                   "epsilon_target": 1.0,
                   "expected": {f"straightdp_release_{SDP_RUN}": {**line, "stage": "release_moments"},
                                f"straightdp_train_{SDP_RUN}": {**line, "stage": "train_straightdp",
                                                                **registered({"sampling.scheme": "poisson"})}},
                   "sampling": {"sampler": "straightdp_flow", "steps": TINY["sampling"]["steps"], "guidance": guidance,
                                "batch_size": 12, "n_samples": 12, "seed": 0}})
    return bundle, tmp / "samples.npz"


def test_a_straightdp_bundle_certifies_both_stages_composed_and_samples_the_runs_own_samples(straightdp_bundle):
    from tests.conftest import one_thread

    bundle, own_path = straightdp_bundle
    cert = verify(bundle)
    assert len(cert["transcripts"]) == 2 and cert["mechanisms"] == "moment_release,tha_dpsgd"
    assert 0 < cert["epsilon"] <= 1.0 and cert["ledger_run"] == SDP_RUN
    # the flow's label tables are outside the diffusers transformer: they travel as house tensors
    assert (bundle / "weights" / "house.safetensors").is_file()
    own = load_split(own_path)
    with one_thread():
        again = sample(bundle, 12)
    assert np.array_equal(again.images, own.images) and np.array_equal(again.labels, own.labels)


# ------------------------------------------------------------------- STRAIGHTDP: the release and the public parts

def _release_bundle(world, tmp: Path, run: str, *, shape: list[int], guided: bool = False,  # noqa: F811
                    autoencoder: Path | None = None) -> tuple[Path, Path]:
    """A run that samples from its release (released_only), or from the public flow guided by it (public_guidance),
    optionally decoded by a public autoencoder (the latent variant): its samples and its bundle."""
    from pipeline.config import schema_defaults
    from pipeline.methods.straightdp import stages as sdp
    from tests.conftest import one_thread

    binding = {"run": run, "experiment": "tiny"}
    rel = {"moments": tmp / "release.npz", "ledger": tmp / f"straightdp_release_{run}.jsonl"}
    parts = {"moments": rel["moments"], **({"model": world["init"]} if guided else {}),
             **({"autoencoder": autoencoder} if autoencoder else {})}
    with one_thread():
        sdp.release_moments({"data": world["data"], "geometry": world["geometry"]}, rel,
                            {"straightdp": TINY, "run": run, "private": PRIVATE, "ledger_binding": binding})
        sdp.sample_straightdp(parts, {"samples": tmp / "samples.npz"},
                              {"straightdp": TINY, "device": "cpu", "run": run, "shape": shape})
    (tmp / "metrics.json").write_text(json.dumps({"fid": 400.0}))
    line = {"claims": 1, "run": run, "delta": 1e-5, "data": str(world["data"]), "configuration": False,
            **registered({"count": 1})}
    smp = {**schema_defaults("straightdp", "sampling"), **TINY["sampling"]}
    sampling = {"sampler": "straightdp_flow", "samples_from": "guided" if guided else "release", "steps": smp["steps"],
                "guidance": smp["guidance"], "batch_size": 12, "n_samples": 12, "seed": 0, "shape": shape,
                **({"t0": schema_defaults("straightdp", "guidance")["t0"]} if guided else {})}
    bundle = tmp / "bundles" / "straightdp" / run
    inputs = {"samples": tmp / "samples.npz", "metrics": tmp / "metrics.json", "moments": rel["moments"],
              f"ledger_straightdp_release_{run}": rel["ledger"], **({"public_flow": world["init"]} if guided else {}),
              **({"autoencoder": autoencoder} if autoencoder else {})}
    export_bundle(inputs, {"bundle": bundle},
                  {"method": "straightdp", "run": run, "experiment": "tiny", "kind": "model", "dataset": "blobs",
                   "epsilon_target": 1.0,
                   "expected": {f"straightdp_release_{run}": {**line, "stage": "release_moments"}},
                   "sampling": sampling})
    return bundle, tmp / "samples.npz"


def _redraws_its_runs_samples(bundle: Path, own_path: Path) -> None:
    from tests.conftest import one_thread

    own = load_split(own_path)
    with one_thread():
        again = sample(bundle, 12)
    assert np.array_equal(again.images, own.images) and np.array_equal(again.labels, own.labels)


def test_a_released_only_bundle_ships_the_release_and_redraws_its_runs_samples(world, tmp_path):  # noqa: F811
    bundle, own = _release_bundle(world, tmp_path, "released_only_eps1_seed0", shape=[1, 8, 8])
    cert = verify(bundle)
    assert [c["path"] for c in cert["contents"]] == ["release/moments.npz"] and cert["library_name"] is None
    assert not (bundle / "weights").exists() and cert["mechanisms"] == "moment_release"
    _redraws_its_runs_samples(bundle, own)


def test_a_public_guidance_bundle_ships_the_release_and_the_public_flow_and_redraws_its_runs_samples(
        world, tmp_path):  # noqa: F811
    bundle, own = _release_bundle(world, tmp_path, "public_guidance_eps1_seed0", shape=[1, 8, 8], guided=True)
    cert = verify(bundle)
    assert [c["path"] for c in cert["contents"]] == ["release/moments.npz", "public/flow/"]
    assert cert["library_name"] == "diffusers" and (bundle / "public" / "flow" / "denoiser.json").is_file()
    _redraws_its_runs_samples(bundle, own)
    # the release is certified like weights: altering it after export is refused
    moments = bundle / "release" / "moments.npz"
    moments.write_bytes(moments.read_bytes()[:-1] + bytes([moments.read_bytes()[-1] ^ 1]))
    with pytest.raises(BundleError, match="release/moments.npz differs"):
        verify(bundle)


def test_a_latent_bundle_ships_the_public_decoder_and_redraws_its_runs_samples(world, tmp_path):  # noqa: F811
    import torch

    from pipeline.flow import autoencoder

    torch.manual_seed(0)  # a public decoder whose codes are the release's 64 dims: 4 channels of 4 x 4
    ae = autoencoder.ConvAutoencoder(autoencoder.AutoencoderSpec(image_size=16, channels=1, code_channels=4, width=8))
    autoencoder.save(tmp_path / "autoencoder.pt", ae, {"mse": 0.5})
    bundle, own = _release_bundle(world, tmp_path, "released_only_eps1_seed0", shape=[4, 4, 4],
                                  autoencoder=tmp_path / "autoencoder.pt")
    cert = verify(bundle)
    assert "public/autoencoder/" in [c["path"] for c in cert["contents"]]
    assert load_split(own).images.shape == (12, 1, 16, 16)
    _redraws_its_runs_samples(bundle, own)


# --------------------------------------------------------------------------- DP-MERF: the generator

from tests.baselines.test_dp_merf import SMALL, splits  # noqa: E402,F401 (the tiny DP-MERF data)

MERF_RUN = "dp_merf_eps2_seed0"


def test_a_dp_merf_bundle_ships_its_generator_verifies_and_samples(splits, tmp_path):  # noqa: F811
    from pipeline.baselines.dp_merf import dp_merf
    from tests.conftest import one_thread

    out = {"samples": tmp_path / "s.npz", "ledger": tmp_path / f"baselines_{MERF_RUN}.jsonl",
           "metrics": tmp_path / "train.json", "generator": tmp_path / f"{MERF_RUN}.safetensors"}
    with one_thread():
        dp_merf({"data": splits / "private.npz", "public": splits / "public.npz"}, out,
                {"run": MERF_RUN, "baselines": SMALL, "device": "cpu", "config_id": "t",
                 "private": {"N": 30, "n_classes": 3},
                 "ledger_binding": {"run": MERF_RUN, "experiment": "tiny"}})
    (tmp_path / "metrics.json").write_text(json.dumps({"fid": 500.0}))
    bundle = tmp_path / "bundles" / "baselines" / MERF_RUN
    export_bundle({"model": out["generator"], "samples": out["samples"], "metrics": tmp_path / "metrics.json",
                   f"ledger_baselines_{MERF_RUN}": out["ledger"]}, {"bundle": bundle},
                  {"method": "baselines", "run": MERF_RUN, "experiment": "tiny", "kind": "model", "epsilon_target": 2.0,
                   "expected": {f"baselines_{MERF_RUN}": {"claims": 1, "run": MERF_RUN, "stage": "dp_merf",
                                                          "delta": 1e-5, "data": str(splits / "private.npz"),
                                                          "configuration": False,
                                                          **registered({"count": 1}, target=2.0)}},
                   "sampling": {"sampler": "dp_merf", "seed": 0, "n_samples": 12, "batch_size": 12, "threads": 1}})
    cert = verify(bundle)
    assert cert["mechanisms"] == "dp_merf_embedding" and cert["epsilon"] <= 2.0
    assert (bundle / "weights" / "generator.safetensors").is_file() and not list(bundle.rglob("*.pt"))
    a, b = sample(bundle, 9), sample(bundle, 9)
    assert a.images.shape == (9, 1, 8, 8) and np.array_equal(a.images, b.images)
    assert np.bincount(a.labels).tolist() == [3, 3, 3]
    _flip_a_byte(bundle / "weights" / "generator.safetensors")
    with pytest.raises(BundleError, match="generator.safetensors differs"):
        verify(bundle)


def test_a_dp_merf_successors_bundle_finds_its_generator_stream_in_a_fresh_process():
    """A bundle is sampled in a process that ran no stage: the successors' streams must be found all the same
    (a DP-NTK bundle failed with 'unknown random stream dp_ntk.generator' before); the baselines declare them."""
    code = ("from pipeline.methods.baselines.bundle import generator_stream\n"
            "for m in ('dp_merf', 'dp_hp', 'dp_ntk', 'dp_mepf'):\n"
            "    generator_stream({'stream': f'{m}.generator'}, 0)\n"
            "generator_stream({}, 0)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
