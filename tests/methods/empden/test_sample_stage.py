"""Stage empden_sample: one EMPDEN cell -> unconditional samples + exactly the ledger line the tables recompute."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from pipeline.methods.accounting.blocks import AccountingConfig
from pipeline.config import validate_config
from pipeline.io import Split, load_split, read_json, save_split
from pipeline.models.checkpoint import save_denoiser
from pipeline.models.edm import EDMPrecond
from pipeline.models.unet import UNetSpec, build_unet
from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger
from pipeline.privacy.schedule import block_mu, k_private_steps
from pipeline.methods.empden.grid import Cell
from pipeline.privacy import empirical_denoiser as emp
from pipeline.methods.empden.sample_stage import empden_figure2_trajectories, empden_sample, trajectories
from pipeline.stage import PipelineError

SIDE = 8
N_PRIVATE = 40
#: accounting section of the tests: a coarse PLD grid (speed only) and a short N_full_batch
ACCOUNTING = {**validate_config({})["accounting"], "discretisation": 1e-3, "log_mass_truncation": -50.0,
              "N": 12, "N_full_batch": 12}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("empden_stage")
    rng = np.random.default_rng(0)
    private = Split(rng.integers(0, 256, size=(N_PRIVATE, 1, SIDE, SIDE), dtype=np.uint8),
                    rng.integers(0, 10, size=N_PRIVATE).astype(np.int64))
    save_split(root / "private_train.npz", private, name="private_train", source="test", seed=0)
    public = Split(rng.integers(0, 256, size=(30, 1, SIDE, SIDE), dtype=np.uint8), np.zeros(30, dtype=np.int64))
    save_split(root / "public.npz", public, name="public", source="test", seed=0)
    torch.manual_seed(0)
    spec = UNetSpec(image_size=SIDE, channels=1, block_out_channels=(8, 16), attention=(False, False))
    save_denoiser(root / "public_edm.pt", EDMPrecond(build_unet(spec)), unet=spec, precond="edm")
    return root


def run(files, tmp_path, cell: Cell, *, n_out: int = 6, with_public: bool = True, with_ledger: bool = True,
        normaliser: dict | None = None, with_public_data: bool = True):
    """Run the stage on one cell; ``normaliser``: the normaliser params (default: none, i.e. constant)."""
    inputs = {"private": files / "private_train.npz"}
    if with_public:
        inputs["public"] = files / "public_edm.pt"
    if with_public_data:
        inputs["public_data"] = files / "public.npz"
    outputs = {"samples": tmp_path / "samples.npz"}
    if with_ledger:
        outputs["ledger"] = tmp_path / "ledger.jsonl"
    params = {"cell": cell.as_dict(), "accounting": ACCOUNTING, "n_out": n_out, "device": "cpu",
              "config_id": "test", "batch_size": 4, "ledger_binding": {"run": "r", "experiment": "exp"}, **(normaliser or {})}
    empden_sample(inputs, outputs, params)
    return load_split(outputs["samples"]), read_json(tmp_path / "samples.json")["empden"], outputs.get("ledger")


def test_hybrid_cell_claims_the_eps_the_accounting_tables_compute_for_the_same_block(files, tmp_path):
    """mu_bar_B and q_B of the sampler equal AccountingConfig's for (p, B); the ledger eps is PLD at N_out = n_out."""
    cell = Cell("hybrid", seed=0, beta=1.0, p_percent=55, B=10, T=2)
    samples, facts, ledger_path = run(files, tmp_path, cell, n_out=6)
    assert samples.images.shape == (6, 1, SIDE, SIDE) and samples.images.dtype == np.uint8
    assert (samples.labels == -1).all()  # unconditional samples
    cfg = AccountingConfig.from_params({"accounting": {**ACCOUNTING, "B": [10]}, "n": N_PRIVATE})
    k = k_private_steps(cfg.N, 55)
    assert facts["k_steps"] == k and facts["q_B"] == pytest.approx(10 / N_PRIVATE)
    assert facts["mu_bar_B"] == pytest.approx(block_mu(cfg.mu_t(10), k), rel=1e-12)
    (_, entry), = list(ledger.read_ledger(ledger_path))
    assert entry.mechanism == "empden_outputwise_block" and entry.count == 6
    want = acc.pld_epsilon(acc.outputwise_event(facts["mu_bar_B"], facts["q_B"], 6), ACCOUNTING["delta"],
                           settings=acc.PLDSettings(ACCOUNTING["discretisation"], ACCOUNTING["log_mass_truncation"]))
    assert entry.claimed_epsilon == pytest.approx(want) == pytest.approx(facts["claimed_epsilon"])


def test_rerunning_a_cell_replaces_its_transcript_instead_of_appending(files, tmp_path):
    cell = Cell("hybrid", seed=1, beta=1.0, p_percent=55, B=10, T=2)
    run(files, tmp_path, cell, n_out=2)
    run(files, tmp_path, cell, n_out=2)
    assert len(list(ledger.read_ledger(tmp_path / "ledger.jsonl"))) == 1


def test_per_step_cell_is_accounted_by_prop_c1(files, tmp_path):
    cell = Cell("per_step", seed=0, beta=1.0, p_percent=55, B=10, T=2)
    _, _, ledger_path = run(files, tmp_path, cell, n_out=2)
    (_, entry), = list(ledger.read_ledger(ledger_path))
    assert entry.mechanism == "empden_per_step_subsampled"


def test_same_seed_gives_hybrid_and_per_step_the_same_initial_noise_and_different_outputs(files, tmp_path):
    """Figure 2 compares the two resampling schemes from identical initial noise (common random numbers)."""
    a, _, _ = run(files, tmp_path / "a", Cell("hybrid", seed=3, beta=1.0, p_percent=55, B=10, T=2), n_out=3)
    b, _, _ = run(files, tmp_path / "b", Cell("per_step", seed=3, beta=1.0, p_percent=55, B=10, T=2), n_out=3)
    c, _, _ = run(files, tmp_path / "c", Cell("hybrid", seed=3, beta=1.0, p_percent=55, B=10, T=2), n_out=3)
    assert np.array_equal(a.images, c.images)  # seeded: reproducible
    assert not np.array_equal(a.images, b.images)


def test_full_batch_cell_composes_exactly_in_gdp_to_its_sigma_min(files, tmp_path):
    cell = Cell("full_batch", seed=0, beta=1.0, sigma_min=0.5)
    samples, facts, ledger_path = run(files, tmp_path, cell, n_out=3, with_public=False)
    assert samples.images.shape == (3, 1, SIDE, SIDE)
    (_, entry), = list(ledger.read_ledger(ledger_path))
    assert entry.mechanism == "empden_full_batch" and entry.accountant["name"] == "gdp"
    assert entry.extra["sigma_min"] == 0.5 and entry.extra["N"] == ACCOUNTING["N_full_batch"]
    assert entry.claimed_epsilon == pytest.approx(acc.gdp_epsilon(ACCOUNTING["delta"], facts["mu_total"]))


def test_lower_sigma_min_costs_more_privacy(files, tmp_path):
    eps = [run(files, tmp_path / str(s), Cell("full_batch", seed=0, beta=1.0, sigma_min=s), n_out=1,
               with_public=False)[1]["claimed_epsilon"] for s in (5.0, 0.5)]
    assert eps[0] < eps[1]


def test_public_only_cell_reads_no_private_data_and_writes_no_ledger(files, tmp_path):
    samples, facts, _ = run(files, tmp_path, Cell("public_only", seed=0), n_out=3, with_ledger=False)
    assert samples.images.shape == (3, 1, SIDE, SIDE)
    assert facts["claimed_epsilon"] == 0.0 and facts["k_steps"] == 0
    assert not (tmp_path / "ledger.jsonl").exists()


@pytest.mark.parametrize(("cell", "kwargs", "message"), [
    (Cell("hybrid", seed=0, beta=1.0, p_percent=55, B=N_PRIVATE + 1, T=2), {}, "exceeds the private set size"),
    (Cell("hybrid", seed=0, beta=1.0, p_percent=55, B=10, T=2), {"with_public": False}, "needs the public denoiser"),
    (Cell("hybrid", seed=0, beta=1.0, p_percent=55, B=10, T=2), {"with_ledger": False}, "needs --out ledger"),
    (Cell("hybrid", seed=0, beta=1.0, p_percent=55, B=10, T=30), {}, "re-noising T=30"),
])
def test_bad_cells_fail_with_one_line(files, tmp_path, cell, kwargs, message):
    with pytest.raises(PipelineError, match=message) as err:
        run(files, tmp_path, cell, n_out=1, **kwargs)
    assert "\n" not in str(err.value)


def test_figure2_shows_both_schemes_and_accounts_its_own_release(files, tmp_path):
    """Figure 2's trajectories are a release: one Prop. 4.1 line and one Prop. C.1 line for its n_rows outputs."""
    out = {"figure": tmp_path / "f2.png", "ledger": tmp_path / "f2.jsonl"}
    empden_figure2_trajectories(
        {"private": files / "private_train.npz", "public": files / "public_edm.pt"}, out,
        {"figure2": {"p": 55, "B": 10, "T": 2, "n_rows": 2, "n_columns": 4}, "accounting": ACCOUNTING,
         "beta": 1.0, "seed": 0, "device": "cpu", "ledger_binding": {"run": "r", "experiment": "exp"}})
    assert out["figure"].stat().st_size > 0 and (tmp_path / "f2.pdf").is_file()
    entries = [e for _, e in ledger.read_ledger(out["ledger"])]
    assert [e.mechanism for e in entries] == ["empden_outputwise_block", "empden_per_step_subsampled"]
    assert all(e.count == 2 for e in entries)


def test_figure2_trajectories_start_from_identical_noise_and_diverge(tmp_path):
    rng = np.random.default_rng(1)
    private = Split(rng.integers(0, 256, size=(30, 1, 4, 4), dtype=np.uint8), np.zeros(30, dtype=np.int64))
    sink = emp.LedgerSink(path=tmp_path / "l.jsonl", stage="test", config_id="test", seed=0, delta=1e-5,
                          pld=acc.PLDSettings(1e-2, -20.0))
    traj = trajectories(private, lambda x, s: torch.zeros_like(x), p_percent=55, B=5, T=2, beta=1.0,
                        accounting=ACCOUNTING, n_rows=3, seed=0, sink=sink, device=torch.device("cpu"))
    a, b = traj["per_output"], traj["per_step"]
    assert torch.equal(a[0][1], b[0][1])  # identical initial noise
    assert not torch.equal(a[-1][1], b[-1][1])
    assert a[-1][0] == 0.0 and len(a) == len(b)



def test_a_class_conditional_public_denoiser_is_asked_with_its_null_label(files, tmp_path):
    """EMPDEN samples are unconditional: a CFG-trained public model gets the label-dropout index num_classes."""
    torch.manual_seed(0)
    spec = UNetSpec(image_size=SIDE, channels=1, block_out_channels=(8, 16), attention=(False, False), num_classes=10)
    save_denoiser(tmp_path / "cond.pt", EDMPrecond(build_unet(spec)), unet=spec, precond="edm")
    out = {"samples": tmp_path / "s.npz"}
    empden_sample({"private": files / "private_train.npz", "public": tmp_path / "cond.pt"}, out,
                  {"cell": Cell("public_only", seed=0).as_dict(), "accounting": ACCOUNTING, "n_out": 2,
                   "device": "cpu"})
    assert load_split(out["samples"]).images.shape == (2, 1, SIDE, SIDE)


@pytest.mark.parametrize("cell", [Cell("hybrid", seed=0, beta=1.0, p_percent=55, B=10, T=2),
                                  Cell("full_batch", seed=0, beta=1.0, sigma_min=0.5)])
def test_public_marginal_normaliser_changes_the_samples_and_is_recorded_but_claims_the_same_eps(files, tmp_path, cell):
    runs = {name: run(files, tmp_path / name, cell, n_out=3, with_public=cell.method != "full_batch",
                      normaliser={"normaliser": name})
            for name in ("constant", "public_marginal")}
    (const, const_facts, const_ledger), (pub, pub_facts, pub_ledger) = runs["constant"], runs["public_marginal"]
    assert not np.array_equal(const.images, pub.images)
    assert const_facts["normaliser"] == "constant" and const_facts["normaliser_n"] is None
    assert pub_facts["normaliser"] == "public_marginal" and pub_facts["normaliser_n"] == 30
    assert pub_facts["claimed_epsilon"] == const_facts["claimed_epsilon"]
    (_, entry), = list(ledger.read_ledger(pub_ledger))
    assert entry.extra["normaliser"] == "public_marginal"


def test_normaliser_n_keeps_a_fixed_subset_of_the_public_records(files, tmp_path):
    cell = Cell("hybrid", seed=0, beta=1.0, p_percent=55, B=10, T=2)
    a, facts, _ = run(files, tmp_path / "a", cell, n_out=2, normaliser={"normaliser": "public_marginal",
                                                                        "normaliser_n": 12})
    b, _, _ = run(files, tmp_path / "b", cell, n_out=2, normaliser={"normaliser": "public_marginal",
                                                                    "normaliser_n": 12})
    assert facts["normaliser_n"] == 12 and np.array_equal(a.images, b.images)


@pytest.mark.parametrize(("normaliser", "kwargs", "message"), [
    ({"normaliser": "public_marginal"}, {"with_public_data": False}, "needs the public split"),
    ({"normaliser": "posterior"}, {}, "empden.normaliser: must be one of"),
    ({"normaliser": "public_marginal", "normaliser_n": 0}, {}, "normaliser_n: must be >= 1"),
])
def test_bad_normaliser_settings_fail_with_one_line(files, tmp_path, normaliser, kwargs, message):
    cell = Cell("hybrid", seed=0, beta=1.0, p_percent=55, B=10, T=2)
    with pytest.raises(PipelineError, match=message) as err:
        run(files, tmp_path, cell, n_out=1, normaliser=normaliser, **kwargs)
    assert "\n" not in str(err.value)


def test_the_default_normaliser_is_the_public_marginal():
    """eq. 38 read literally (constant) is inert at image dimensions, so the embedded default normalises publicly."""
    cfg = validate_config({})["empden"]
    assert cfg["normaliser"] == "public_marginal" and cfg["normaliser_n"] is None


def test_figure2_records_the_public_normaliser_in_both_ledger_lines(files, tmp_path):
    out = {"figure": tmp_path / "f2.png", "ledger": tmp_path / "f2.jsonl"}
    empden_figure2_trajectories(
        {"private": files / "private_train.npz", "public": files / "public_edm.pt",
         "public_data": files / "public.npz"}, out, {"figure2": {"p": 55, "B": 10, "T": 2, "n_rows": 2, "n_columns": 4}, "accounting": ACCOUNTING,
              "beta": 1.0, "seed": 0, "device": "cpu", "normaliser": "public_marginal", "ledger_binding": {"run": "r", "experiment": "exp"}})
    assert [e.extra["normaliser"] for _, e in ledger.read_ledger(out["ledger"])] == ["public_marginal"] * 2


@pytest.mark.parametrize("cell", [Cell("hybrid", seed=0, beta=1.0, p_percent=55, B=10, T=2),
                                  Cell("per_step", seed=0, beta=1.0, p_percent=55, B=10, T=2),
                                  Cell("full_batch", seed=0, beta=1.0, sigma_min=1.0), Cell("public_only", seed=0)],
                         ids=lambda c: c.method)
def test_the_log_shows_outputs_done_after_every_batch(files, tmp_path, cell, capsys, monkeypatch):
    """A long cell's log tail says how far it is: outputs done of n_out after each batch of 4 (6 = 4 + 2)."""
    import pipeline.methods.empden.sample_stage as stage_module

    monkeypatch.setattr(stage_module, "PROGRESS_INTERVAL_S", 0.0)  # every batch, not every 30 s
    run(files, tmp_path, cell, n_out=6, with_ledger=cell.private)
    log = capsys.readouterr().err
    assert f"empden_sample {cell.name}" in log
    assert re.search(r"4/6 \[[0-9:]+<[0-9:?]+", log), "no progress line (done/total [elapsed<eta]) after batch 1"
    assert "6/6" in log
