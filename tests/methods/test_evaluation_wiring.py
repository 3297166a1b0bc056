"""The evaluation core's wiring (pipeline/methods/_evaluation.py): the evaluation network, the CLIP file every
evaluation reads, and the params of an evaluate job."""

from __future__ import annotations

import copy
import json
import shlex


from pipeline.config import config_id
from pipeline.plugins import method_names
from pipeline.methods._evaluation import Wiring
from pipeline.wiring import House
from tests.methods import house


def variant(h: House, **evaluation) -> House:
    """The same house with config ``evaluation`` keys replaced (not validated: the wiring reads, never checks)."""
    cfg = copy.deepcopy(dict(h.config))
    cfg["evaluation"].update(evaluation)
    return House(cfg, h.layout, h.torch_threads)


def test_the_evaluation_core_is_no_method():
    assert "_evaluation" not in method_names() and "evaluation" not in method_names()


def test_the_evaluation_network_and_clip_live_under_the_experiment(tmp_path):
    ev = Wiring(house(tmp_path))
    exp = tmp_path / "r" / "digits"
    assert ev.evalnet == exp / "evalnet" and ev.evalnet_model == exp / "evalnet" / "evalnet.pt"
    assert ev.clip_dir == exp / "clip" and ev.clip_model == exp / "clip" / "clip.pt"
    assert ev.reference_real_metrics == exp / "eval" / "reference_real" / "metrics.json"


def test_an_evaluation_reads_the_clip_file_only_when_clip_metrics_are_on(tmp_path):
    h = house(tmp_path)
    assert h.config["evaluation"]["clip"]["enabled"]
    ev = Wiring(h)
    assert ev.clip_inputs() == {"clip": ev.clip_model}
    off = Wiring(variant(h, clip={**h.config["evaluation"]["clip"], "enabled": False}))
    assert off.clip_inputs() == {}
    # the stage call gets ' clip=<path>' (quoted for the shell) or nothing
    assert shlex.split(Wiring.clip_arg(None, {"clip": "a b/clip.pt"})) == ["clip=a b/clip.pt"]
    assert ev.clip_arg(None, {"samples": "s.npz"}) == ""


def test_the_clip_training_keys_reach_an_evaluation_only_through_the_clip_file(tmp_path):
    h = house(tmp_path)
    ev = Wiring(h)
    assert ev.params()["clip"] == {"enabled": True}
    assert {k: v for k, v in ev.params().items() if k != "clip"} == {
        k: v for k, v in h.config["evaluation"].items() if k != "clip"}
    p = json.loads(ev.evaluate_params("empden/hybrid/p50_B100_T3_beta1_s0"))
    assert p == {"evaluation": ev.params(), "seed": 0, "device": h.config["device"], "threads": h.torch_threads,
                 "name": "empden/hybrid/p50_B100_T3_beta1_s0"}
    assert "config_id" not in p  # a metrics file is named by its samples, not by an id
    # a shard's features job (sampling.shards) reads the feature space the evaluation scores in
    assert json.loads(ev.features_params()) == {"evaluation": ev.params(), "device": h.config["device"],
                                                "threads": h.torch_threads}
    # the config's other params leave the evaluation alone; the CLIP steps only change the CLIP file
    more_steps = variant(h, clip={**h.config["evaluation"]["clip"], "steps": 5})
    assert Wiring(more_steps).evaluate_params("x") == ev.evaluate_params("x")
    assert Wiring(more_steps).clip_params() != ev.clip_params()


def test_the_evalnet_and_clip_jobs_params(tmp_path):
    h = house(tmp_path)
    ev = Wiring(h)
    assert json.loads(ev.evalnet_params()) == {"evalnet": h.config["evaluation"]["evalnet"], "seed": 0,
                                               "device": h.config["device"]}
    clip = {k: v for k, v in h.config["evaluation"]["clip"].items() if k != "enabled"}
    assert ev.trains_clip
    trained = json.loads(ev.clip_params())
    assert trained == {"clip": clip, "seed": 0, "threads": h.torch_threads,
                       "config_id": config_id({"clip": clip, "seed": 0})}
    imported = Wiring(variant(h, clip={**h.config["evaluation"]["clip"], "source": "pretrained"}))
    assert not imported.trains_clip
    assert set(json.loads(imported.clip_params())) == {"clip", "config_id"}
