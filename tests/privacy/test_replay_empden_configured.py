"""Issue #54: the replay certifies an EMPDEN line only when it is what the configuration ran.

Real transcripts: a tiny configuration's EMPDEN cells (hybrid, per-step, full batch), Figure 2 and the accounting
tables' block claims, each written by its own stage with the params its wiring gives the rule, and replayed against
the registrations the same wirings give the rule ``replay`` (``Wiring.replay_params``), through the replay stage and
the command line. The genuine transcripts pass. Each forgery is self-consistent (its event rebuilds from its line and
its claim covers the eps recomputed from it) and claims less than what ran; the registered parameters refuse it:

* the issue's forgery 2: a line's n doubled with its batch B kept (q halved);
* the issue's forgery 4: an ``empden_blocks`` claim of a grid block relabelled ``source = "given"`` with mu_bar_B
  halved (only the blocks the configuration gives directly may say given);
* a shard's line claiming fewer outputs than its shard drew.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pipeline.io import Split, save_split
from pipeline.methods.accounting.wiring import Wiring as AccountingWiring
from pipeline.methods.empden.wiring import Wiring as EmpdenWiring
from pipeline.models.checkpoint import save_denoiser
from pipeline.models.edm import EDMPrecond
from pipeline.models.unet import UNetSpec, build_unet
from pipeline.privacy import accountants as acc
from pipeline.privacy import certify, ledger, rebuild
from pipeline.privacy.replay import ReplayError, replay
from pipeline.methods.accounting.blocks import empden_blocks
from pipeline.methods.empden.grid import Cell
from pipeline.methods.empden.sample_stage import empden_figure2_trajectories, empden_gather, empden_sample
from pipeline.wiring import House
from tests.ledgers import EXPERIMENT, registration
from tests.ledgers import replay_stage as run_replay
from tests.methods import house

SIDE, N = 8, 40
HYBRID, PER_STEP, FULL_BATCH = "hybrid/p55_B10_T2_beta1_s0", "per_step/p55_B10_T2_beta1_s0", "full_batch/smin0p5_beta1_s0"
WILDCARDS = {HYBRID: ("hybrid", {"p": "55", "B": "10", "T": "2", "beta": "1", "seed": "0"}),
             PER_STEP: ("per_step", {"p": "55", "B": "10", "T": "2", "beta": "1", "seed": "0"}),
             FULL_BATCH: ("full_batch", {"smin": "0p5", "beta": "1", "seed": "0"})}


def tiny(cfg: dict[str, Any]) -> None:
    """config.yaml cut to EMPDEN and its accounting on N = 40 records: a 12-step grid, 10 outputs per cell in
    batches of 4, Figure 2's pair of cells, one full-batch cell, and the block tables' one grid block and one
    mu_bar_B given directly."""
    cfg.update(experiment=EXPERIMENT, methods=["accounting", "empden"], bundles=False)
    cfg["data"]["private"]["n_private_train"] = N
    cfg["accounting"] = {"N": 12, "N_full_batch": 12, "B": [10], "p": [55], "mu_bar_B": [0.9], "N_out": 20}
    cfg["empden"] = {"n_out": 10, "batch_size": 4, "normaliser": "constant", "grid": [{"p": [55], "B": [10], "T": [2]}],
                     "beta_ablation": None, "repeated_seeds": None, "public_only": False,
                     "figure2": {"p": 55, "B": 10, "T": 2, "n_rows": 2}, "full_batch": {"sigma_min": [0.5]}}


@dataclasses.dataclass
class Run:
    house: House
    #: transcript stem -> path, as the rule replay hands them in
    transcripts: dict[str, Path]
    #: the rule replay's params (the wirings' registrations of the transcripts written)
    params: dict[str, Any]

    @property
    def expected(self) -> dict[str, Any]:
        return self.params["expected"]


def inputs(root: Path, h: House, *, public: bool = True) -> dict[str, Path]:
    return {"private": h.layout.split("private_train"), **({"public": root / "public_edm.pt"} if public else {})}


def run_the_stages(root: Path, edit: Callable[[dict[str, Any]], None] = tiny) -> Run:
    """Every stage of the configuration that writes a transcript, with its wiring's params, on a private split of the
    configuration's declared N; the registrations the replay rule would pass."""
    h = house(root, edit)
    rng = np.random.default_rng(0)
    save_split(h.layout.split("private_train"),
               Split(rng.integers(0, 256, size=(N, 1, SIDE, SIDE), dtype=np.uint8),
                     rng.integers(0, 10, size=N).astype(np.int64)), name="private_train", source="test", seed=0)
    torch.manual_seed(0)
    spec = UNetSpec(image_size=SIDE, channels=1, block_out_channels=(8, 16), attention=(False, False))
    save_denoiser(root / "public_edm.pt", EDMPrecond(build_unet(spec)), unet=spec, precond="edm")
    em, ac = EmpdenWiring(h), AccountingWiring(h)
    written = []
    for name, (method, wildcards) in WILDCARDS.items():
        cell = Cell.from_name(name)
        ins = inputs(root, h, public=method != "full_batch")
        if em.sharded:
            for k in range(em.shards):
                empden_sample(ins, {"samples": em.shard_path(cell, k), "ledger": em.shard_ledger(cell, k)},
                              json.loads(em.sample_params(method, {**wildcards, "shard": str(k)})))
            rest = name.split("/", 1)[1]
            empden_gather({**em.gather_inputs({"method": method, "rest": rest})},
                          {"samples": em.sample_path(cell), "ledger": em.ledger_path(cell)},
                          json.loads(em.gather_params({"method": method, "rest": rest})))
        else:
            empden_sample(ins, {"samples": em.sample_path(cell), "ledger": em.ledger_path(cell)},
                          json.loads(em.sample_params(method, wildcards)))
        written.append(em.ledger_path(cell))
    empden_figure2_trajectories(inputs(root, h), {"figure": root / "figure2.png", "ledger": em.figure2_ledger},
                                json.loads(em.figure2_params()))
    empden_blocks({}, {"blocks": ac.blocks, "ledger": ac.ledger}, json.loads(ac.blocks_params()))
    written += [em.figure2_ledger, ac.ledger]
    specs = {**em.transcripts(), **ac.transcripts()}
    assert set(written) <= set(specs)
    return Run(h, {p.stem: p for p in written}, json.loads(ac.replay_params({p: specs[p] for p in written})))


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> Run:
    return run_the_stages(tmp_path_factory.mktemp("configured"))


# --------------------------------------------------------------------------- forging a line

def forged(run: Run, tmp_path: Path, stem: str, line: int,
           forge: Callable[[ledger.LedgerEntry], ledger.LedgerEntry]) -> dict[str, Path]:
    """The run's transcripts with line ``line`` of ``stem`` replaced by ``forge`` of it, its claim the eps
    recomputed from the forged line (so it is covered): a copy, the genuine files untouched."""
    entries = [e for _, e in ledger.read_ledger(run.transcripts[stem])]
    fake = forge(entries[line])
    entries[line] = dataclasses.replace(fake, claimed_epsilon=certify.recompute(fake))
    rebuild.check(entries[line])  # self-consistent: its event is its parameters'
    path = tmp_path / "forged" / f"{stem}.jsonl"
    path.parent.mkdir(exist_ok=True)
    path.write_text("".join(e.to_json() + "\n" for e in entries))
    return {**run.transcripts, stem: path}


def stating(entry: ledger.LedgerEntry, **change: Any) -> ledger.LedgerEntry:
    """``entry`` restated for its block with ``change`` (an :class:`EmpdenBlock` field): every field the block
    determines (event, sampling, count, noise, mu_bar_B / mu_total) made to match, so its event rebuilds."""
    block = dataclasses.replace(rebuild.empden_block(entry), **change)
    m = block.mechanism()
    derived = {k: f() for k, f in (("mu_bar_B", lambda: block.mu_bar_B),
                                     ("mu_total", lambda: acc.gdp_mu_of_event(m.event))) if k in entry.extra}
    return dataclasses.replace(entry, event=ledger.event_to_dict(m.event), sampling=block.sampling(),
                               count=block.N_out, sensitivity=m.sensitivity, noise_std=m.sensitivity / m.mu_core,
                               noise_multiplier=1 / m.mu_core, extra={**entry.extra, **derived})


def n_doubled(entry: ledger.LedgerEntry) -> ledger.LedgerEntry:
    """The issue's forgery 2: n doubled, the batch B kept (q_B halved; a full batch's B is its n)."""
    n = 2 * entry.sampling["n"]
    return stating(entry, n=n, **({"B": n} if entry.mechanism == "empden_full_batch" else {}))


def relabelled_given(entry: ledger.LedgerEntry) -> ledger.LedgerEntry:
    """The issue's forgery 4: a grid block's claim relabelled as a mu_bar_B given directly, and that halved."""
    mu = entry.extra["mu_bar_B"] / 2
    event = acc.outputwise_event(mu, entry.sampling["probability"], entry.count)
    return dataclasses.replace(entry, event=ledger.event_to_dict(event), noise_std=1 / mu, noise_multiplier=1 / mu,
                               extra={**entry.extra, "source": "given", "mu_bar_B": mu})


def stem_of(run: Run, name: str) -> str:
    return EmpdenWiring(run.house).ledger_path(Cell.from_name(name)).stem


def failures(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and r.name == "pipeline.privacy.replay"]


def cli(run: Run, tmp_path: Path, transcripts: dict[str, Path]) -> subprocess.CompletedProcess:
    """``python -m pipeline replay`` as the rule runs it: --in stem=path ..., the rule's params from a file."""
    (tmp_path / "params.json").write_text(json.dumps(run.params))
    return subprocess.run([sys.executable, "-m", "pipeline", "replay", "--in",
                           *(f"{k}={v}" for k, v in transcripts.items()), "--out", f"report={tmp_path / 'cli.json'}",
                           "--params", f"@{tmp_path / 'params.json'}"],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=300)


# --------------------------------------------------------------------------- the genuine run passes

def test_every_line_the_stages_wrote_is_registered_with_the_parameters_it_holds(genuine):
    mechanisms = set()
    for stem, path in genuine.transcripts.items():
        params = genuine.expected[stem]["params"]
        entries = [e for _, e in ledger.read_ledger(path)]
        assert len(entries) == len(params) == genuine.expected[stem]["claims"]
        for entry, registered in zip(entries, params):
            mechanisms.add(entry.mechanism)
            assert registered and all(not rebuild.differences(rebuild.lookup(entry, k), v, k)
                                      for k, v in registered.items())
    assert mechanisms == {"empden_outputwise_block", "empden_per_step_subsampled", "empden_full_batch"}
    # the block claims hold one grid block and the mu_bar_B the configuration gives directly
    assert [p["extra.source"] for p in genuine.expected["empden_blocks"]["params"]] == ["schedule", "given"]
    assert genuine.expected["empden_blocks"]["params"][1]["extra.mu_bar_B"] == 0.9


def test_the_genuine_transcripts_pass_the_replay_stage_and_the_command_line(genuine, tmp_path):
    report = run_replay(tmp_path, expected=genuine.expected, **genuine.transcripts)
    assert report["all_ok"] and report["n_claims"] == 3 + 2 + 2
    res = cli(genuine, tmp_path, genuine.transcripts)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((tmp_path / "cli.json").read_text())["all_ok"]


# --------------------------------------------------------------------------- forgery 2: n doubled, B kept

@pytest.mark.parametrize("name", [HYBRID, PER_STEP, FULL_BATCH])
def test_a_line_with_n_doubled_and_its_batch_kept_is_refused(genuine, tmp_path, caplog, name):
    stem = stem_of(genuine, name)
    ins = forged(genuine, tmp_path, stem, 0, n_doubled)
    (real,), (fake,) = ([e for _, e in ledger.read_ledger(p)] for p in (genuine.transcripts[stem], ins[stem]))
    assert fake.sampling["n"] == 2 * N and (fake.sampling.get("B") == real.sampling.get("B") or name == FULL_BATCH)
    assert fake.claimed_epsilon < real.claimed_epsilon  # what the forgery buys
    with pytest.raises(ReplayError, match=rf"{stem}\.jsonl:1: sampling\.n is {2 * N}, the configuration ran {N}"):
        run_replay(tmp_path, expected=genuine.expected, **ins)
    found = failures(caplog)
    assert any(f"sampling.n (the private set's size N) is {2 * N}, the split it read holds {N} records" in f
               for f in found)
    # nothing else about the line is wrong: its event, claim and settings are its own
    assert all(stem in f and "sampling." in f for f in found)
    res = cli(genuine, tmp_path, ins)
    assert res.returncode != 0 and f"sampling.n is {2 * N}, the configuration ran {N}" in res.stderr


# --------------------------------------------------------------------------- forgery 4: relabelled "given"

def test_a_grid_block_claim_relabelled_given_with_mu_bar_halved_is_refused(genuine, tmp_path, caplog):
    ins = forged(genuine, tmp_path, "empden_blocks", 0, relabelled_given)
    real, fake = ([e for _, e in ledger.read_ledger(p)][0] for p in (genuine.transcripts["empden_blocks"],
                                                                     ins["empden_blocks"]))
    assert fake.extra["source"] == "given" and fake.claimed_epsilon < real.claimed_epsilon
    # registered by its count alone, as before the issue, a configuration claim may say given: the forgery passed
    old = {**genuine.expected, "empden_blocks": registration(ins["empden_blocks"], Path("unused"))}
    assert run_replay(tmp_path, expected=old, **ins)["all_ok"]
    with pytest.raises(ReplayError, match=r"empden_blocks\.jsonl:1: extra\.(source|mu_bar_B) is"):
        run_replay(tmp_path, expected=genuine.expected, **ins)
    found = failures(caplog)
    assert any("empden_blocks.jsonl:1: extra.source is 'given', the configuration ran 'schedule'" in f for f in found)
    assert any(f"empden_blocks.jsonl:1: extra.mu_bar_B is {fake.extra['mu_bar_B']!r}, the configuration ran "
               f"{real.extra['mu_bar_B']!r}" in f for f in found)
    assert len(found) == 2  # nothing else: the forged line is self-consistent
    res = cli(genuine, tmp_path, ins)
    assert res.returncode != 0 and "extra.source is 'given', the configuration ran 'schedule'" in res.stderr


def test_the_given_block_is_held_to_the_mu_bar_the_configuration_gives(genuine, tmp_path):
    def halved(entry: ledger.LedgerEntry) -> ledger.LedgerEntry:
        assert entry.extra["source"] == "given"
        return relabelled_given(entry)

    ins = forged(genuine, tmp_path, "empden_blocks", 1, halved)
    with pytest.raises(ReplayError, match=r"empden_blocks\.jsonl:2: extra\.mu_bar_B is 0\.45, the configuration "
                                          r"ran 0\.9"):
        run_replay(tmp_path, expected=genuine.expected, **ins)


# --------------------------------------------------------------------------- a sharded cell

@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Run:
    """The same configuration sampled in sampling.shards = 3 jobs per cell (outputs 4, 4 and 2), joined."""
    def edit(cfg: dict[str, Any]) -> None:
        tiny(cfg)
        cfg["sampling"] = {"shards": 3}

    return run_the_stages(tmp_path_factory.mktemp("sharded"), edit)


def test_a_sharded_cells_lines_are_registered_one_per_shard_with_its_outputs(sharded, tmp_path):
    stem = stem_of(sharded, HYBRID)
    assert [p["count"] for p in sharded.expected[stem]["params"]] == [4, 4, 2]
    assert [e.count for _, e in ledger.read_ledger(sharded.transcripts[stem])] == [4, 4, 2]
    assert run_replay(tmp_path, expected=sharded.expected, **sharded.transcripts)["all_ok"]


def test_a_shards_line_claiming_fewer_outputs_than_it_drew_is_refused(sharded, tmp_path):
    stem = stem_of(sharded, HYBRID)

    ins = forged(sharded, tmp_path, stem, 0, lambda e: stating(e, N_out=1))
    with pytest.raises(ReplayError, match=rf"{stem}\.jsonl:1: count is 1, the configuration ran 4"):
        run_replay(tmp_path, expected=sharded.expected, **ins)
