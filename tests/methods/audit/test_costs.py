"""The audits' cost model (pipeline/methods/audit/costs.py): the GPU memory of DPDM's non-private twin and of the
membership attacks grows with the records and the batch they hold, and bounds what the stages really hold when they
run on the CPU (torch's memory tracker, the one pipeline/footprint.py counts with)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import pipeline.resources as cost
from pipeline import footprint
from pipeline.config import validate_config
from pipeline.methods.audit import costs
from pipeline.methods.audit.wiring import Wiring
from pipeline.methods.dpdm import costs as dpdm_costs
from tests.methods import house


def config(**sections):
    return validate_config(sections)


def test_the_twin_holds_its_training_set_and_one_whole_batch_of_k_draws():
    cfg = config()
    fp = footprint.footprint("edm_unet", dpdm_costs.network(cfg))
    n, batch = costs.twin_batch(cfg)
    # the default twin: twin_members records, fewer than a batch: every step is full-batch
    assert n == cfg["audit"]["mia"]["twin_members"] == batch < cfg["dpdm"]["batch_size"]
    plan = costs.twin_memory(cfg)
    image = cost.image_channels(cfg) * cost.image_side(cfg) ** 2
    assert plan.predicted_bytes == pytest.approx(
        cost.TRAIN_STATE_BYTES_PER_PARAM * fp.params + n * (4 * image + 8)
        + cost.TRANSIENT_FACTOR * fp.activation_bytes(batch * cfg["audit"]["mia"]["twin_K"])
        + cost.GPU_RESERVE_BYTES)
    more = costs.twin_memory(config(audit={"mia": {"twin_members": 200}}))
    draws = costs.twin_memory(config(audit={"mia": {"twin_K": 4}}))
    assert more.batch == 200 and more.predicted_bytes > plan.predicted_bytes
    assert draws.predicted_bytes > plan.predicted_bytes
    # on the whole private split the Poisson batch is bounded a few standard deviations above its mean
    whole = config(audit={"mia": {"twin_train_on": "private_train"}})
    n, batch = costs.twin_batch(whole)
    assert n == whole["data"]["private"]["n_private_train"]
    q = whole["dpdm"]["batch_size"] / n
    assert q * n < batch <= q * n + costs.POISSON_SDS * np.sqrt(q * n * (1 - q)) + 1
    assert costs.twin_memory(whole).predicted_bytes > plan.predicted_bytes


def test_the_attacks_hold_the_private_split_and_the_non_members_beside_one_batch():
    cfg = config()
    plan = costs.mia_memory(cfg, "edm_unet", dpdm_costs.network(cfg))
    p = cfg["data"]["private"]
    record = 4 * cost.image_channels(cfg) * cost.image_side(cfg) ** 2
    held = (p["n_private_train"] + 3 * p["n_reference"]) * (record + 8) + costs.ATTACK_STATE_TENSORS * 250 * record
    assert plan == cost.forward_memory("audit_mia", "edm_unet", dpdm_costs.network(cfg), costs.MIA_BATCH,
                                       held_bytes=held)
    larger = config(data={"private": {"n_private_train": 3000, "n_reference": 500, "n_test": 100, "n_eval_train": 100}})
    assert costs.mia_memory(larger, "edm_unet", dpdm_costs.network(larger)).predicted_bytes > plan.predicted_bytes


def test_each_attack_job_counts_the_model_it_attacks(tmp_path):
    w = Wiring(house(tmp_path), lambda methods: {})
    res = w.resources("audit_mia")
    models = w.mia_models()
    assert {m for m, _ in models} == {"dpdm", "dpdm_twin", "straightdp"}
    c = w.house.config
    for method, run in models:
        kind, net = costs.mia_network(w, SimpleNamespace(method=method, run=run))
        assert kind == ("flow_mmdit" if method == "straightdp" else "edm_unet")
        if method == "straightdp":
            assert net == w.straightdp.flow_network(w.straightdp.run(SimpleNamespace(run=run)).arm)
        assert res["gpu_mem_mb"](SimpleNamespace(method=method, run=run)) == costs.mia_memory(c, kind, net).predicted_mb
    assert w.resources("train_dpdm_twin")["gpu_mem_mb"](SimpleNamespace(seed="0")) == costs.twin_memory(c).predicted_mb
    # STRAIGHTDP's runs on a public flow the user brings: a network the configuration does not describe
    w.house.config["straightdp"]["pretrain"]["source"] = "diffusers"
    assert "gpu_mem_mb" not in w.resources("audit_mia")


def test_the_attacks_batch_and_state_are_the_stages():
    from pipeline.audit import mia
    from pipeline.privacy.mia import STOPPING_POINTS

    for fn in (mia.loss_scores, mia.secmi_scores):
        assert inspect.signature(fn).parameters["batch_size"].default == costs.MIA_BATCH
    assert costs.ATTACK_STATE_TENSORS == len(STOPPING_POINTS) + 4


def _peak(run):
    """The peak bytes of everything ``run()`` allocates, by torch's memory tracker. The tracker refuses a module called
    again at the top level (the attacks call the denoiser many times): every call is wrapped in a fresh module."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    with tracker:
        run()
    return sum(dev["Total"] for dev in tracker.get_tracker_snapshot("peak").values())


class _Call(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        return self.model(*args)


def test_the_predictions_bound_what_the_twin_and_the_attacks_hold_on_the_cpu(tmp_path, monkeypatch):
    """The real stages on the CPU at a small configuration (a tiny UNet, 16 x 16 images, full batches of the attacks):
    each peak, everything the stage allocates, is at most its prediction less the driver's reserve."""
    from pipeline.audit import mia, mia_stage
    from pipeline.io import Split, save_split
    from pipeline.methods.audit.twin import train_dpdm_twin
    from tests.audit.test_mia_stage import GRID, MIA
    from tests.conftest import one_thread
    from tests.training.test_dp_denoiser import TINY_UNET

    n, n_ref = 300, 250
    cfg = config(data={"private": {"n_private_train": n, "n_reference": n_ref}}, dpdm={"unet": TINY_UNET},
                 audit={"mia": {"twin_members": 120, "twin_K": 2}})
    rng = np.random.default_rng(0)
    paths = {}
    for name, size in (("private_train", n), ("reference", n_ref)):
        paths[name] = tmp_path / f"{name}.npz"
        save_split(paths[name], Split(rng.integers(0, 256, (size, 1, 16, 16), dtype=np.uint8), np.arange(size) % 10),
                   name=name, source="test", seed=0)
    d = cfg["dpdm"]
    params = {"batch_size": d["batch_size"], "steps": 1, "lr": 1e-3, "K": 2, "unet": d["unet"], "device": "cpu",
              "seed": 0, "members": 120, "member_seed": 0, "class_conditional": True, "config_id": "t"}
    model = tmp_path / "twin.pt"
    with one_thread():
        twin = _peak(lambda: train_dpdm_twin({"data": paths["private_train"], "nonmembers": paths["reference"]},
                                             {"model": model, "metrics": tmp_path / "twin.json"}, params))
        wrapped = mia.ve_denoiser
        monkeypatch.setattr(mia_stage.mia, "ve_denoiser", lambda m: wrapped(lambda *a: _Call(m)(*a)))
        plain = tmp_path / "plain.pt"
        train_dpdm_twin({"data": paths["private_train"]}, {"model": plain, "metrics": tmp_path / "plain.json"},
                        {k: v for k, v in params.items() if k not in ("members", "member_seed")})
        attacks = _peak(lambda: mia_stage.audit_mia(
            {"model": plain, "members": paths["private_train"], "nonmembers": paths["reference"]},
            {"metrics": tmp_path / "mia.json"},
            {"mia": {**MIA, "secmi_inversion_steps": 4, "loss_draws": 1, "loss_sigmas": [0.5]}, "grid": GRID,
             "method": "dpdm", "run": "plain", "nonmember_split": "reference", "seed": 0, "device": "cpu"}))
    assert costs.twin_batch(cfg) == (120, 120)
    predicted_twin = costs.twin_memory(cfg).predicted_bytes - cost.GPU_RESERVE_BYTES
    predicted_attacks = costs.mia_memory(cfg, "edm_unet", dpdm_costs.network(cfg)).predicted_bytes \
        - cost.GPU_RESERVE_BYTES
    assert twin <= predicted_twin < 4 * twin
    assert attacks <= predicted_attacks < 4 * attacks
