"""The replay certifies a DP-SGD line only as the configuration ran it (issue #54, forgeries 1-3 and 6).

The lines are written by DP-SGD's own accounting (the calibration and ledger line every DP-SGD stage uses) for runs
of config.yaml's baselines (DP-Diffusion, DP-Promise's two phases), bound as the stages bind them; the registration
is the baselines wiring's, passed as the rule ``replay`` passes it, through the replay stage and its command line.
Each forgery keeps its line self-consistent (its event rebuilt from its edited parameters and its claim recomputed),
so only the registration -- what the configuration ran -- can refuse it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipeline.baselines.runs import BaselineRun
from pipeline.methods.baselines.wiring import PHASE1, PHASE2, Wiring
from pipeline.privacy import dpsgd_plan, ledger, rebuild
from pipeline.privacy.certify import recompute
from pipeline.privacy.replay import ReplayError, replay
from pipeline.wiring import House
from tests.methods import house as config_house

ROOT = Path(__file__).resolve().parents[2]
SPLIT_SHA = "a" * 64


@dataclass
class Run:
    """One experiment's baselines runs: their transcripts as the stages wrote them, and the rule replay's params."""

    house: House
    wiring: Wiring
    transcripts: dict[str, Path]
    params: dict[str, Any]


def _house(tmp_path: Path, experiment: str, epochs: int) -> House:
    def edit(cfg: dict[str, Any]) -> None:
        cfg["experiment"] = experiment
        cfg["baselines"].update(methods=["dp_diffusion", "dp_promise"], epsilons=[1], seeds=[0])
        cfg["baselines"]["dp_diffusion"]["epochs"] = epochs
    return config_house(tmp_path, edit)


def _write_split(house: House) -> None:
    """The private split's manifest (the replay reads its sha256 and size N only)."""
    path = house.layout.split("private_train")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps({"sha256": SPLIT_SHA, "n": house.private["N"]}))


def _write(path: Path, plan: dpsgd_plan.DPSGDPlan, house: House, run: str, phase: str = "") -> ledger.LedgerEntry:
    """The line stage train_dpdm writes for ``plan``, bound as its ``ledger_binding`` and split bind it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = dpsgd_plan.ledger_entry(plan, stage="train_dpdm", config_id="c", seed=0)
    return ledger.append_entry(path, entry, ledger.Binding(run=run, experiment=house.config["experiment"],
                                                           data_sha256=SPLIT_SHA, phase=phase))


def _plan(house: House, method: str, target: float, prior: list[ledger.LedgerEntry] = ()) -> dpsgd_plan.DPSGDPlan:
    """The calibrated plan of a baseline's DP-SGD, as its stage calibrates it (the declared N, its section's batch,
    epochs and clip; sigma to ``target`` composed after the ``prior`` lines)."""
    own, N = house.config["baselines"][method], house.private["N"]
    steps = dpsgd_plan.dpsgd_steps(dataset_size=N, batch_size=own["batch_size"], epochs=own["epochs"])
    return dpsgd_plan.plan_for_budget(target_epsilon=target, delta=house.config["baselines"]["delta"],
                                      max_grad_norm=own["clip"], batch_size=own["batch_size"], dataset_size=N,
                                      steps=steps, prior=[e.dp_event() for e in prior])


def _run(tmp_path: Path, experiment: str = "digits", epochs: int = 4) -> Run:
    house = _house(tmp_path, experiment, epochs)
    wiring = Wiring(house)
    _write_split(house)
    diffusion, promise = (next(r for r in wiring.runs() if r.method == m) for m in ("dp_diffusion", "dp_promise"))
    _write(wiring.ledger_path(diffusion.name), _plan(house, "dp_diffusion", diffusion.epsilon), house, diffusion.name)
    share = house.config["baselines"]["dp_promise"]["phase1_share"]
    phase1 = _write(wiring.phase1_ledger_path(promise.name), _plan(house, "dp_promise", share * promise.epsilon),
                    house, promise.name, PHASE1)
    _write(wiring.ledger_path(promise.name), _plan(house, "dp_promise", promise.epsilon, [phase1]), house,
           promise.name, PHASE2)
    specs = {p: s for p, s in wiring.transcripts().items() if BaselineRun.from_name(s.run).method in
             ("dp_diffusion", "dp_promise")}
    return Run(house, wiring, {Path(p).stem: Path(p) for p in specs},
               {"config_id": "c", "experiment": experiment,
                "expected": {Path(p).stem: s.as_dict() for p, s in specs.items()}})


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> Run:
    return _run(tmp_path_factory.mktemp("digits"))


def stem(run: Run, method: str, kind: str = "") -> str:
    r = next(r for r in run.wiring.runs() if r.method == method)
    path = run.wiring.phase1_ledger_path(r.name) if kind == PHASE1 else run.wiring.ledger_path(r.name)
    return path.stem


def forge(run: Run, tmp_path: Path, name: str, change: Callable[[ledger.LedgerEntry], ledger.LedgerEntry]
          ) -> dict[str, Path]:
    """The run's transcripts with ``name``'s line replaced by ``change(line)`` (written beside, the rest as they are)."""
    (entry,) = [e for _, e in ledger.read_ledger(run.transcripts[name])]
    forged = tmp_path / f"{name}.jsonl"
    forged.write_text(change(entry).to_json() + "\n")
    return {**run.transcripts, name: forged}


def stage(run: Run, tmp_path: Path, transcripts: dict[str, Path]) -> dict[str, Any]:
    replay(transcripts, {"report": tmp_path / "replay.json"}, run.params)
    return json.loads((tmp_path / "replay.json").read_text())


def cli(run: Run, tmp_path: Path, transcripts: dict[str, Path]) -> subprocess.CompletedProcess:
    """``python -m pipeline replay`` as the rule runs it (--in stem=path ..., the rule's params)."""
    (tmp_path / "params.json").write_text(json.dumps(run.params))
    return subprocess.run([sys.executable, "-m", "pipeline", "replay", "--in",
                           *(f"{k}={v}" for k, v in transcripts.items()), "--out", f"report={tmp_path / 'cli.json'}",
                           "--params", f"@{tmp_path / 'params.json'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def failures(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and r.name == "pipeline.privacy.replay"]


def restated(entry: ledger.LedgerEntry, **plan_changes: Any) -> ledger.LedgerEntry:
    """``entry`` with its DP-SGD plan changed and everything derived from it rewritten to match (event, sampling
    rate, noise, claim): a forgery the line's own rebuild cannot see."""
    plan = dataclasses.replace(rebuild.dpsgd_plan(entry), **plan_changes)
    line = dpsgd_plan.ledger_entry(plan, stage=entry.stage, config_id=entry.config_id, seed=entry.seed,
                                   extra={k: v for k, v in entry.extra.items()
                                          if k not in ("max_grad_norm", "dpsgd_noise_multiplier",
                                                       "expected_batch_size")})
    line = dataclasses.replace(line, run=entry.run, experiment=entry.experiment, data_sha256=entry.data_sha256,
                               phase=entry.phase, seq=entry.seq, time_utc=entry.time_utc)
    rebuild.check(line)  # self-consistent: the line's rebuild alone passes it
    return dataclasses.replace(line, claimed_epsilon=recompute(line))


# --------------------------------------------------------------------------- the genuine run passes

def test_every_line_is_registered_with_what_the_configuration_ran_and_replays(genuine, tmp_path):
    for name, spec in genuine.params["expected"].items():
        (entry,) = [e for _, e in ledger.read_ledger(genuine.transcripts[name])]
        assert spec["params"] == [dpsgd_plan.configured_line(
            dataset_size=2500, batch_size=entry.extra["expected_batch_size"], steps=entry.count,
            max_grad_norm=entry.extra["max_grad_norm"])]
    phase1, phase2 = (genuine.params["expected"][stem(genuine, "dp_promise", k)] for k in (PHASE1, PHASE2))
    assert (phase1["phase"], phase1["epsilon_target"], phase1["after"]) == (PHASE1, [0.5], [])
    assert (phase2["phase"], phase2["epsilon_target"]) == (PHASE2, [1.0])
    assert [Path(p).stem for p in phase2["after"]] == [stem(genuine, "dp_promise", PHASE1)]
    report = stage(genuine, tmp_path, genuine.transcripts)
    assert report["all_ok"] and report["n_claims"] == 3
    res = cli(genuine, tmp_path, genuine.transcripts)
    assert res.returncode == 0, res.stderr[-2000:]


def test_the_registered_steps_follow_the_configuration(tmp_path):
    house = _house(tmp_path, "digits", epochs=8)
    spec = next(s for s in Wiring(house).transcripts().values() if s.run.startswith("dp_diffusion"))
    own = house.config["baselines"]["dp_diffusion"]
    assert spec.params[0]["count"] == -(-8 * 2500 // own["batch_size"])


# --------------------------------------------------------------------------- 1. a copied phase

def test_a_copied_phase_is_refused_as_the_same_release(genuine, tmp_path, caplog):
    """Phase II's transcript replaced by phase I's line, its time moved by a second (the issue's 0.708 for
    0.99969): the line's identity (run, experiment, stage, phase, seq) is phase I's, handed in twice."""
    p1, p2 = stem(genuine, "dp_promise", PHASE1), stem(genuine, "dp_promise", PHASE2)
    (phase1,) = [e for _, e in ledger.read_ledger(genuine.transcripts[p1])]
    copied = forge(genuine, tmp_path, p2, lambda _: dataclasses.replace(phase1, time_utc="2099-01-01T00:00:01+00:00"))
    with pytest.raises(ReplayError, match="replay FAILED"):
        stage(genuine, tmp_path, copied)
    found = failures(caplog)
    assert any("the same line as" in f and p1 in f for f in found)
    assert any("phase is 'phase1', the transcript is registered for 'phase2'" in f for f in found)
    res = cli(genuine, tmp_path, copied)
    assert res.returncode != 0 and "the same line as" in res.stderr


def test_a_copied_phase_relabelled_as_phase_two_fails_its_calibration(genuine, tmp_path, caplog):
    """The copy with its phase rewritten too: phase II's sigma was calibrated so that both phases composed meet eps
    1; phase I's sigma (calibrated to 0.5 alone) spends far less composed with itself."""
    p1, p2 = stem(genuine, "dp_promise", PHASE1), stem(genuine, "dp_promise", PHASE2)
    (phase1,) = [e for _, e in ledger.read_ledger(genuine.transcripts[p1])]
    copied = forge(genuine, tmp_path, p2, lambda _: dataclasses.replace(phase1, phase=PHASE2))
    with pytest.raises(ReplayError):
        stage(genuine, tmp_path, copied)
    assert any("its noise is not the calibration's" in f and "composed after 1 earlier release" in f
               for f in failures(caplog))


# --------------------------------------------------------------------------- 2. the size N

def test_n_doubled_with_the_batch_kept_is_refused_against_the_manifest(genuine, tmp_path, caplog):
    """The issue's forgery 2 (0.99942 -> 0.46989): q halved by an N the split does not have."""
    name = stem(genuine, "dp_diffusion")
    batch = genuine.house.config["baselines"]["dp_diffusion"]["batch_size"]
    forged = forge(genuine, tmp_path, name, lambda e: restated(e, dataset_size=5000, sampling_rate=batch / 5000))
    (line,) = [e for _, e in ledger.read_ledger(forged[name])]
    (real,) = [e for _, e in ledger.read_ledger(genuine.transcripts[name])]
    assert line.claimed_epsilon < 0.6 * real.claimed_epsilon  # what the forgery would have certified
    with pytest.raises(ReplayError):
        stage(genuine, tmp_path, forged)
    found = failures(caplog)
    assert any("sampling.n (the private set's size N) is 5000, the split it read holds 2500 records" in f
               for f in found)
    assert any("sampling.n is 5000, the configuration ran 2500" in f for f in found)
    res = cli(genuine, tmp_path, forged)
    assert res.returncode != 0 and "the split it read holds 2500 records" in res.stderr


# --------------------------------------------------------------------------- 3. self-consistent parameter edits

def test_steps_halved_are_refused(genuine, tmp_path, caplog):
    """0.99942 -> 0.69407 in the issue: T is what epochs x N / batch gives."""
    name = stem(genuine, "dp_diffusion")
    forged = forge(genuine, tmp_path, name, lambda e: restated(e, steps=e.count // 2))
    with pytest.raises(ReplayError):
        stage(genuine, tmp_path, forged)
    (real,) = [e for _, e in ledger.read_ledger(genuine.transcripts[name])]
    assert any(f"count is {real.count // 2}, the configuration ran {real.count}" in f for f in failures(caplog))
    res = cli(genuine, tmp_path, forged)
    assert res.returncode != 0 and "the configuration ran" in res.stderr


def test_sigma_doubled_is_refused_by_its_calibration(genuine, tmp_path, caplog):
    """0.99942 -> 0.449: a sigma the calibration to eps 1 would not give (0.2% less noise still meets 1)."""
    name = stem(genuine, "dp_diffusion")
    forged = forge(genuine, tmp_path, name, lambda e: restated(e, noise_multiplier=2 * e.extra["dpsgd_noise_multiplier"]))
    with pytest.raises(ReplayError):
        stage(genuine, tmp_path, forged)
    assert any("its noise is not the calibration's" in f and "target eps 1" in f for f in failures(caplog))
    res = cli(genuine, tmp_path, forged)
    assert res.returncode != 0 and "its noise is not the calibration's" in res.stderr


def test_the_calibration_check_fails_when_the_noise_is_switched_off_in_the_registration(genuine, tmp_path):
    """The probe is real: registered at a target the line's noise overshoots by 2x, the genuine line fails."""
    name = stem(genuine, "dp_diffusion")
    params = json.loads(json.dumps(genuine.params))
    params["expected"][name]["epsilon_target"] = [2.0]
    with pytest.raises(ReplayError, match="its noise is not the calibration's"):
        replay(genuine.transcripts, {"report": tmp_path / "r.json"}, params)


def test_a_transcript_moved_from_an_experiment_that_ran_otherwise_is_refused(genuine, tmp_path, caplog):
    """The issue's related forgery: a transcript of experiment ``digits`` (4 epochs) moved into ``other`` (8 epochs,
    the same private split) with its experiment rewritten."""
    other = _run(tmp_path / "other", experiment="other", epochs=8)
    name = stem(other, "dp_diffusion")
    (moved,) = [e for _, e in ledger.read_ledger(genuine.transcripts[stem(genuine, "dp_diffusion")])]
    forged = forge(other, tmp_path, name, lambda _: dataclasses.replace(moved, experiment="other"))
    with pytest.raises(ReplayError):
        stage(other, tmp_path, forged)
    ran = other.params["expected"][name]["params"][0]["count"]
    assert ran > moved.count and any(f"count is {moved.count}, the configuration ran {ran}" in f
                                     for f in failures(caplog))


# --------------------------------------------------------------------------- 6. an unusable RDP setting

def test_an_rdp_line_with_empty_orders_is_refused_in_one_line(tmp_path):
    """dp_accounting raises a raw ValueError on orders = []; the replay names the line and the setting."""
    from tests.ledgers import registration, split_file

    plan = dpsgd_plan.DPSGDPlan(noise_multiplier=2.0, max_grad_norm=0.5, sampling_rate=0.1, dataset_size=100,
                                steps=5, delta=1e-5, sampling="fixed_size")
    entry = dpsgd_plan.ledger_entry(plan, stage="train_dpdm", config_id="c", seed=0)
    path = tmp_path / "a.jsonl"
    ledger.append_entry(path, dataclasses.replace(entry, accountant={**entry.accountant, "orders": []}),
                        ledger.Binding(run="r", experiment="exp", data_sha256="5" * 64))
    data = split_file(tmp_path, n=100)
    with pytest.raises(ReplayError, match=r"a\.jsonl:1: RDP orders \[\] are not a non-empty list"):
        replay({"a": path}, {"report": tmp_path / "r.json"},
               {"config_id": "c", "experiment": "exp", "expected": {"a": registration(path, data)}})


# --------------------------------------------------------------------------- a line calibrated after an earlier one

def test_a_line_calibrated_after_an_earlier_line_of_its_transcript_is_checked_composed_with_it(tmp_path, caplog):
    """Two releases in one transcript (as Fig. 6's toy writes a point's release, then its DP-SGD): the second's sigma
    was calibrated so both composed meet eps 1. Registered so, the pair replays; registered as if the second were
    alone, or with its noise doubled, it is refused."""
    from tests.ledgers import split_file

    data = split_file(tmp_path, n=2500)
    kw = dict(delta=1e-5, max_grad_norm=1.0, batch_size=256, dataset_size=2500, steps=20)
    first = dpsgd_plan.plan_for_budget(target_epsilon=0.5, **kw)
    second = dpsgd_plan.plan_for_budget(target_epsilon=1.0, prior=[first.event()], **kw)
    binding = ledger.Binding(run="r", experiment="exp", data_sha256="5" * 64)
    path = tmp_path / "t.jsonl"
    for plan in (first, second):
        ledger.append_entry(path, dpsgd_plan.ledger_entry(plan, stage="s", config_id="c", seed=0), binding)
    line = dpsgd_plan.configured_line(dataset_size=2500, batch_size=256, steps=20, max_grad_norm=1.0)
    spec = {"claims": 2, "run": "r", "stage": "s", "delta": 1e-5, "data": str(data), "configuration": False,
            "params": [line, line], "epsilon_target": [0.5, 1.0], "after": [], "rtol": 1e-3, "phase": "",
            "prior_lines": [[], [0]]}

    def run(transcript: Path, **changes: Any) -> None:
        replay({"t": transcript}, {"report": tmp_path / "r.json"},
               {"config_id": "c", "experiment": "exp", "expected": {"t": {**spec, **changes}}})

    run(path)
    with pytest.raises(ReplayError, match=r"t\.jsonl:2: its noise is not the calibration's"):
        run(path, prior_lines=[[], []])
    (one, two) = [e for _, e in ledger.read_ledger(path)]
    forged = tmp_path / "forged.jsonl"
    forged.write_text(one.to_json() + "\n" + restated(two, noise_multiplier=2 * second.noise_multiplier).to_json()
                      + "\n")
    with pytest.raises(ReplayError):
        run(forged)
    assert any("forged.jsonl:2: its noise is not the calibration's" in f and "composed after 1 earlier release" in f
               for f in failures(caplog))
