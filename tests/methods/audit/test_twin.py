"""train_dpdm_twin: DPDM's step with the mechanism taken out, nothing else; it writes no ledger line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.data.members import member_indices
from pipeline.models.checkpoint import load_denoiser, read_denoiser_meta
from pipeline.models.precond import parameterisation
from pipeline.models.unet import UNetSpec, build_unet
from pipeline.privacy import dpsgd
from pipeline.stage import PipelineError
from pipeline.methods.audit.twin import train_dpdm_twin, twin_step

from tests.training.test_dp_denoiser import TINY_UNET, private_split  # noqa: F401 (a fixture)


def tiny_model(seed: int = 0):
    torch.manual_seed(seed)
    spec = UNetSpec(image_size=8, channels=1, num_classes=3, **{k: tuple(v) if isinstance(v, list) else v
                                                                 for k, v in TINY_UNET.items()})
    return parameterisation("edm").build(build_unet(spec))


def test_the_twin_step_is_dpsgd_with_no_clip_and_no_noise():
    """Same batch, same draws: the twin's gradient equals DP-SGD's at C = 1e6 (never binding) and
    sigma C = 1e-24; so the twin differs from the DP run by the mechanism only."""
    g = torch.Generator().manual_seed(0)
    images = torch.randn(20, 1, 8, 8, generator=g)
    labels = torch.arange(20) % 3
    config = parameterisation("edm")
    multiplicity = dpsgd.NoiseMultiplicity(2, config.sigma_sampler)
    q = 0.4

    twin = tiny_model()
    sgd = torch.optim.SGD(twin.parameters(), lr=0.0)  # lr 0: keeps .grad, moves nothing
    twin_step(twin, sgd, config.draw_loss, multiplicity, images, labels, q, torch.Generator().manual_seed(5))
    twin_grads = {n: p.grad.clone() for n, p in twin.named_parameters()}

    dp = tiny_model()
    plan = dpsgd.DPSGDPlan(noise_multiplier=1e-30, max_grad_norm=1e6, sampling_rate=q, dataset_size=20, steps=1,
                           delta=1e-5)
    gen = torch.Generator().manual_seed(5)
    engine = dpsgd.DPSGD(dp, dpsgd.multiplicity_loss(config.draw_loss), plan, microbatch_size=64,
                         multiplicity=multiplicity, generator=gen)
    grads, info = engine.privatised_gradient((images, labels), engine.sample())
    assert float(info.grad_norms.max()) < 1e6  # the clip never bound
    for name, grad in grads.items():
        torch.testing.assert_close(twin_grads[name], grad, rtol=1e-4, atol=1e-6)


def test_the_twin_trains_without_a_ledger_and_says_it_is_not_private(private_split, tmp_path):  # noqa: F811
    out = {"model": tmp_path / "twin.pt", "metrics": tmp_path / "twin.json"}
    train_dpdm_twin({"data": private_split}, out, {"batch_size": 8, "steps": 3, "lr": 3e-4, "K": 1, "unet": TINY_UNET,
                                                    "device": "cpu", "seed": 3, "config_id": "test"})
    meta = read_denoiser_meta(out["model"])
    assert meta["private"] is False and meta["positive_control_only"] is True and meta["steps"] == 3
    assert "epsilon" not in meta
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".json" and p.is_file()) == ["twin.pt"]
    model = load_denoiser(out["model"])
    assert model(torch.zeros(2, 1, 8, 8), torch.ones(2), torch.tensor([0, 1])).shape == (2, 1, 8, 8)


def test_a_dp_only_param_is_refused_in_one_line(private_split, tmp_path):  # noqa: F811
    with pytest.raises(PipelineError, match="unknown param 'clip'"):
        train_dpdm_twin({"data": private_split}, {"model": tmp_path / "m.pt", "metrics": tmp_path / "m.json"},
                        {"clip": 1.0, "steps": 1})


def test_twin_seeds_match_the_dp_run(private_split, tmp_path):  # noqa: F811
    """Same seed -> same initial weights as train_dpdm (the stream dpdm.init), so only the mechanism differs."""
    from pipeline.training.dp_denoiser import train_dp_denoiser

    params = {"batch_size": 8, "steps": 1, "lr": 1e-12, "K": 1, "unet": TINY_UNET, "device": "cpu", "seed": 3,
              "config_id": "test", "ema_decay": 0.0}
    train_dpdm_twin({"data": private_split}, {"model": tmp_path / "t.pt", "metrics": tmp_path / "t.json"}, params)
    train_dp_denoiser({"data": private_split}, {"model": tmp_path / "d.pt", "ledger": tmp_path / "d.jsonl",
                                         "metrics": tmp_path / "d.json"},
               {**params, "epsilon": 1.0, "micro_batch": 4, "ledger_binding": {"run": "r", "experiment": "exp"},
                "private": {"N": 40, "n_classes": 3}})
    a, b = load_denoiser(tmp_path / "t.pt").state_dict(), load_denoiser(tmp_path / "d.pt").state_dict()
    for k in a:
        np.testing.assert_allclose(a[k].numpy(), b[k].numpy(), atol=1e-6)


def test_given_the_nonmembers_the_twin_trains_on_exactly_the_attacked_member_subset(private_split, tmp_path):  # noqa: F811
    from pipeline.io import Split, arrays_sha256, load_split, save_split

    nonmembers = tmp_path / "reference.npz"
    save_split(nonmembers, Split(np.zeros((12, 1, 8, 8), np.uint8), np.arange(12) % 3), name="reference",
               source="test", seed=0)
    out = {"model": tmp_path / "twin.pt", "metrics": tmp_path / "twin.json"}
    train_dpdm_twin({"data": private_split, "nonmembers": nonmembers}, out,
                    {"batch_size": 8, "epochs": 2, "K": 1, "unet": TINY_UNET, "device": "cpu", "member_seed": 5})
    meta = read_denoiser_meta(out["model"])
    members = load_split(private_split).images[member_indices(40, 12, 5).numpy()]
    assert meta["n_train"] == 12 and meta["trained_on"] == "the 12 attacked members" and meta["steps"] == 3
    assert meta["members_sha256"] == arrays_sha256({"images": members})


def _reference(tmp_path, n):
    from pipeline.io import Split, save_split

    path = tmp_path / "reference.npz"
    save_split(path, Split(np.zeros((n, 1, 8, 8), np.uint8), np.arange(n) % 3), name="reference", source="test",
               seed=0)
    return path


def test_the_twin_trains_on_the_first_members_of_the_attacked_subset_for_epochs_passes(private_split, tmp_path):  # noqa: F811
    """members = 5 of 12: the prefix of the DP models' attacked subset; 7 passes of the 5, full-batch (batch 8 > 5),
    are 7 steps (DPDenoiserConfig.n_steps would give ceil(7 * 5 / 8) = 5)."""
    from pipeline.io import arrays_sha256, load_split

    out = {"model": tmp_path / "twin.pt", "metrics": tmp_path / "twin.json"}
    train_dpdm_twin({"data": private_split, "nonmembers": _reference(tmp_path, 12)}, out,
                    {"batch_size": 8, "epochs": 7, "K": 1, "unet": TINY_UNET, "device": "cpu", "member_seed": 5,
                     "members": 5})
    meta = read_denoiser_meta(out["model"])
    attacked = member_indices(40, 12, 5).numpy()
    assert member_indices(40, 5, 5).numpy().tolist() == attacked[:5].tolist()  # a prefix: DP-attacked members too
    assert meta["n_train"] == 5 and meta["trained_on"] == "the 5 attacked members"
    assert meta["steps"] == 7 and meta["sampling_rate"] == 1.0
    assert meta["members_sha256"] == arrays_sha256({"images": load_split(private_split).images[attacked[:5]]})


def test_more_twin_members_than_non_members_is_refused_in_one_line(private_split, tmp_path):  # noqa: F811
    with pytest.raises(PipelineError, match=r"members = 13, but a twin trains on 1 to 12 "):
        train_dpdm_twin({"data": private_split, "nonmembers": _reference(tmp_path, 12)},
                        {"model": tmp_path / "m.pt", "metrics": tmp_path / "m.json"},
                        {"epochs": 1, "unet": TINY_UNET, "device": "cpu", "members": 13})


@pytest.mark.slow  # a Snakemake dry run
def test_the_twin_job_gets_config_yamls_twin_settings(repo, tmp_path):
    """What `make run` trains: the train_dpdm_twin job's params carry config.yaml's audit.mia twin_* keys."""
    import json
    import shlex

    import yaml

    from tests.test_workflow import snakemake

    mia = yaml.safe_load((repo / "config.yaml").read_text())["audit"]["mia"]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**yaml.safe_load((repo / "config.yaml").read_text()),
                                   "results_dir": str(tmp_path / "results")}))
    res = snakemake(repo, "-n", "-p", "--cores", "1", str(tmp_path / "results" / "digits" / "models" / "dpdm" /
                                                         "twin_seed0.pt"), "--configfile", str(cfg))
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(ln for ln in res.stdout.splitlines() if "pipeline train_dpdm_twin" in ln)
    args = shlex.split(line)
    params = json.loads(args[args.index("--params") + 1])
    assert "nonmembers=" in line  # twin_train_on: members
    assert (params["members"], params["epochs"], params["K"]) == (mia["twin_members"], mia["twin_epochs"],
                                                                  mia.get("twin_K", 1))
    assert (mia["twin_members"], mia["twin_epochs"]) == (100, 500)  # the embedded default's control (README)
