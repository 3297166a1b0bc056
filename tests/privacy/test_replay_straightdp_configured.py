"""Issue #54 for STRAIGHTDP: a ledger line is certified only when it is what the configuration ran.

A run's Stage 1 line (``moment_release``, written by the real ``release_moments`` stage) and Stage 2 line
(``tha_dpsgd``, planned by the stage's own ``stage2_plan`` and written as ``train_straightdp`` writes it) are
replayed through the replay stage against the registrations STRAIGHTDP's wiring makes of config.yaml
(pipeline/methods/straightdp/wiring.py ``transcripts``). The genuine lines pass; a line edited to spend less,
consistently (its event rebuilt and its claim recomputed, so it rebuilds and covers its claim), is refused:
steps halved, noise doubled, the private set's size N doubled with the batch kept.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from pipeline.config import deep_merge, validate_config
from pipeline.methods.straightdp import stages as sdp
from pipeline.io import Split, save_split
from pipeline.methods.straightdp.wiring import Wiring
from pipeline.privacy import ledger, moments, tha
from pipeline.privacy.replay import ReplayError
from pipeline.training.data import manifest_sha256
from pipeline.methods.straightdp.runs import StraightRun
from pipeline.wiring import House
from tests.ledgers import EXPERIMENT, replay_stage

ROOT = Path(__file__).parents[2]
#: config.yaml's distilling uniform row: its release at 0.2 / 0.85 of eps 1, then one-bucket DP-SGD composed after it
RUN = StraightRun("uniform_moments", 1.0, 0)
#: the horizon tau the stage would read from horizon.json (measured on the public set; not registered)
TAU = 0.35
#: the feature clip R of the public geometry (a public quantile; not registered)
R_PUBLIC = 4.0


def wiring(root: Path) -> Wiring:
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    cfg = deep_merge(cfg, {"results_dir": str(root / "results"), "experiment": EXPERIMENT})
    return Wiring(House.from_config(validate_config(cfg)))


def write_line(path: Path, entry: ledger.LedgerEntry, binding: ledger.Binding) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    ledger.append_entry(path, entry, binding)
    return path


def train_entry(plan: tha.THAPlan, total: float) -> ledger.LedgerEntry:
    """The line train_straightdp writes for ``plan`` (its extras)."""
    return tha.ledger_entry(plan, stage="train_straightdp", config_id="c", seed=RUN.seed,
                            extra={"run": RUN.name, "row": RUN.row, "tau": TAU, "total_target_epsilon": RUN.epsilon,
                                   "total_certified_epsilon": total, "composed_with_release": True,
                                   "proxy_scores": {}, "data_sha256": "x"})


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> SimpleNamespace:
    """config.yaml's wiring, the declared private split (N random 16x16 digits), the run's genuine release line
    (the release_moments stage) and Stage 2 line (the stage's planner), and their registrations."""
    root = tmp_path_factory.mktemp("configured")
    w = wiring(root)
    N, n_classes = w.house.private["N"], w.house.private["n_classes"]
    rng = np.random.default_rng(0)
    data = w.private_data()
    save_split(data, Split(rng.integers(0, 256, (N, 1, 16, 16), dtype=np.uint8), np.arange(N) % n_classes),
               name="private_train", source="test", seed=0)
    wc = SimpleNamespace(run=RUN.name)
    # the release: the real stage, on a public geometry of the config's p and the stage's params from the wiring
    p = int(w.arm_section()["release"]["p"])
    geometry = root / "geometry.npz"
    np.savez(geometry, mean=np.zeros(256), basis=np.eye(256)[:p], R=np.array(R_PUBLIC),
             public_eigvals=np.linspace(1.0, 0.01, 256))
    release_ledger = w.release_ledger(RUN.name)
    release_ledger.parent.mkdir(parents=True, exist_ok=True)
    sdp.release_moments({"data": data, "geometry": geometry},
                        {"moments": root / "moments.npz", "ledger": release_ledger},
                        json.loads(w.private_run_params(wc)))
    # Stage 2: the stage's planner with the train job's params, after the release's event (as the stage reads it)
    params = json.loads(w.private_run_params(wc, train=True))
    prior = sdp.release_event(release_ledger)
    plan, _ = sdp.stage2_plan(RUN, sdp.section(params), n=N, tau=TAU, spectrum=np.linspace(1.0, 0.01, 32),
                              prior=prior, proxy_grads=None)
    total = plan.epsilon(prior_event=prior)
    binding = ledger.binding_of(params, data_sha256=manifest_sha256(data, "data"), stage="train_straightdp")
    train_ledger = write_line(w.train_ledger(RUN.name), train_entry(plan, total), binding)
    (release_line,) = [e for _, e in ledger.read_ledger(release_ledger)]
    specs = w.transcripts()
    return SimpleNamespace(w=w, root=root, data=data, binding=binding, plan=plan, total=total,
                           release=release_line, release_ledger=release_ledger, train_ledger=train_ledger,
                           specs={path.stem: specs[path] for path in (release_ledger, train_ledger)})


def replay(world: SimpleNamespace, tmp_path: Path, caplog, *, release: Path | None = None, train: Path | None = None,
           **overrides) -> list[str]:
    """The replay stage on the run's two transcripts (``release`` / ``train``: forged copies in their place) with the
    wiring's registrations (``overrides``: fields of the train transcript's); its failures, [] if it passed."""
    transcripts = {world.release_ledger.stem: release or world.release_ledger,
                   world.train_ledger.stem: train or world.train_ledger}
    expected = {name: spec.as_dict() for name, spec in world.specs.items()}
    expected[world.train_ledger.stem].update(overrides)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="pipeline.privacy.replay"):
        try:
            report = replay_stage(tmp_path, world.data, json.loads(json.dumps(expected)), **transcripts)
        except ReplayError:
            return [r.getMessage() for r in caplog.records if r.name == "pipeline.privacy.replay"]
    assert report["all_ok"] and report["n_claims"] == 2 and all(c["ok"] for c in report["claims"])
    return []


def forged(world: SimpleNamespace, name: str, entry: ledger.LedgerEntry) -> Path:
    """``entry`` bound as the genuine line was, in a transcript of its own (same stem, another folder)."""
    return write_line(world.root / "forged" / name / f"{name}.jsonl", entry, world.binding)


def test_the_wiring_registers_what_the_stages_ran(world):
    release, train = world.specs.values()
    assert release.epsilon_target == (pytest.approx(RUN.epsilon * 0.2 / 0.85),)
    assert train.after == (str(world.release_ledger),) and train.epsilon_target == (RUN.epsilon,)
    # the genuine lines carry every registered value
    assert all(world.release.extra[k.split(".")[1]] == pytest.approx(v)
               for k, v in release.params[0].items() if k.startswith("extra."))
    assert world.plan.steps == train.params[0]["count"] == 30 and world.plan.dataset_size == 2500


def test_the_genuine_lines_pass(world, tmp_path, caplog):
    assert replay(world, tmp_path, caplog) == []


def test_steps_halved_with_the_event_rebuilt_to_match_are_refused(world, tmp_path, caplog):
    half = dataclasses.replace(world.plan, steps=world.plan.steps // 2)
    entry = train_entry(half, world.total)
    assert entry.claimed_epsilon < train_entry(world.plan, world.total).claimed_epsilon  # consistent, claiming less
    failures = replay(world, tmp_path, caplog, train=forged(world, world.train_ledger.stem, entry))
    assert any("count is 15, the configuration ran 30" in f for f in failures)
    assert any("extra.T_k is [15], the configuration ran [30]" in f for f in failures)


def test_stage2_noise_doubled_consistently_is_refused(world, tmp_path, caplog):
    loud = dataclasses.replace(world.plan, noise_std=2 * world.plan.noise_std)
    entry = train_entry(loud, world.total)
    assert entry.claimed_epsilon < 0.6 * tha.ledger_entry(world.plan, stage="s", config_id="c", seed=0).claimed_epsilon
    failures = replay(world, tmp_path, caplog, train=forged(world, world.train_ledger.stem, entry))
    assert len(failures) == 1 and "its noise is not the calibration's" in failures[0]
    assert "composed after 1 earlier release(s)" in failures[0] and "target eps 1" in failures[0]


def test_the_release_noise_doubled_consistently_is_refused(world, tmp_path, caplog):
    plan = moments.plan_from_entry(world.release)
    loud = moments.ledger_entry(dataclasses.replace(plan, sigma=2 * plan.sigma), stage="release_moments",
                                config_id="c", seed=RUN.seed, extra={k: world.release.extra[k] for k in (
                                    "run", "target_epsilon", "total_epsilon", "data_sha256")})
    failures = replay(world, tmp_path, caplog, release=forged(world, world.release_ledger.stem, loud))
    assert any(f.startswith(f"{world.root / 'forged'}") and ":1: its noise is not the calibration's" in f
               and "target eps 0.235294" in f for f in failures)


def test_n_doubled_with_the_batch_kept_is_refused(world, tmp_path, caplog):
    plan = world.plan
    wide = dataclasses.replace(plan, dataset_size=2 * plan.dataset_size, sampling_rate=plan.sampling_rate / 2)
    assert wide.expected_batch_size == pytest.approx(plan.expected_batch_size)
    failures = replay(world, tmp_path, caplog, train=forged(world, world.train_ledger.stem, train_entry(wide, 0.5)))
    assert any("sampling.n (the private set's size N) is 5000, the split it read holds 2500 records" in f
               for f in failures)
    assert any("sampling.n is 5000, the configuration ran 2500" in f for f in failures)
    # the release's N doubled too: its M2 noise normalised by a set twice the size
    rel = moments.plan_from_entry(world.release)
    entry = moments.ledger_entry(dataclasses.replace(rel, N=2 * rel.N), stage="release_moments", config_id="c",
                                 seed=RUN.seed, extra={k: world.release.extra[k] for k in (
                                     "run", "target_epsilon", "total_epsilon", "data_sha256")})
    failures = replay(world, tmp_path, caplog, release=forged(world, world.release_ledger.stem, entry))
    assert any("extra.N is 5000, the configuration ran 2500" in f for f in failures)
    assert any("extra.N (the private set's size N) is 5000, the split it read holds 2500" in f for f in failures)


def test_the_calibration_is_checked_composed_after_the_release_as_the_stage_calibrated_it(world, tmp_path, caplog):
    # the stage calibrated Stage 2's noise so that Composed([release, THA]) meets eps: alone, that noise spends less
    # than eps, so a registration without the release transcript refuses the genuine line
    failures = replay(world, tmp_path, caplog, after=[])
    assert len(failures) == 1 and "its noise is not the calibration's" in failures[0]
    # and registered as calibrated to a larger eps than it was, its noise is more than that calibration gives
    failures = replay(world, tmp_path, caplog, epsilon_target=[2.0])
    assert len(failures) == 1 and "the target eps 2 the configuration calibrated it to" in failures[0]
