"""Replay: every claim recomputed from the transcripts alone, every event rebuilt from its line's parameters.

Each mechanism writes its line here through its own code (the samplers, the accounting stage,
DP-SGD); the replay must pass those, and must fail when an event no longer matches the
parameters next to it, when a parameter is edited, when a transcript is missing, empty or
cut off, or when a mechanism has no rebuilder.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.results import empden_accounting as accounting
from pipeline.privacy.replay import ReplayError, audit, recompute, replay
from pipeline.config import validate_config
from pipeline.io import Split
from pipeline.privacy import accountants as acc
from pipeline.privacy import dp_merf, dpsgd, ledger, moments, private_evolution, rebuild, text_moments, tha
from pipeline.privacy import empirical_denoiser as emp
from pipeline.privacy.schedule import EDMSchedule
from pipeline.sampling import empden
from pipeline.sampling.empden_stage import trajectories
from pipeline.stage import PipelineError

COARSE = acc.PLDSettings(1e-2, -20.0)  # test speed only
DELTA = 1e-5
SCHEDULE = EDMSchedule(N=12)
#: the config's accounting section on a short grid and a coarse PLD (speed only)
ACCOUNTING = {**validate_config({})["accounting"], "discretisation": 1e-2, "log_mass_truncation": -20.0,
              "N": 12, "N_full_batch": 12}
PIPELINE_SOURCE = Path(__file__).resolve().parents[2] / "pipeline"


def private_images(n: int = 24) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(0).uniform(-1, 1, size=(n, 1, 4, 4)))


def sink(path: Path) -> emp.LedgerSink:
    return emp.LedgerSink(path=path, stage="test", config_id="c", seed=0, delta=DELTA, pld=COARSE)


def zero_denoiser(x: torch.Tensor, sigma: float) -> torch.Tensor:
    return torch.zeros_like(x)


# --------------------------------------------------------------------------- each mechanism's own writer

def write_hybrid(path: Path) -> None:
    """Algorithm 1 (one B-subset per output, Prop. 4.1), as the sampler records it."""
    empden.sample_hybrid(private_images(), n_out=3, B=6, p_percent=55, T=2, public_denoiser=zero_denoiser, C=0.5,
                         beta=1.0, sink=sink(path), generator=torch.Generator().manual_seed(0), schedule=SCHEDULE)


def write_per_step(path: Path) -> None:
    """Per-step resampling (Prop. C.1), as the sampler records it."""
    empden.sample_hybrid(private_images(), n_out=3, B=6, p_percent=55, T=2, public_denoiser=zero_denoiser, C=0.5,
                         beta=1.0, sink=sink(path), generator=torch.Generator().manual_seed(0), schedule=SCHEDULE,
                         resample="per_step")


def write_full_batch(path: Path) -> None:
    """Full batch (Sec. 3.2, exact GDP), as the sampler records it."""
    empden.sample_full_batch(private_images(), n_out=3, C=0.5, beta=1.0, sink=sink(path),
                             generator=torch.Generator().manual_seed(0), schedule=SCHEDULE)


def write_figure2(path: Path) -> None:
    """EMPDEN Figure 2: its trajectories are a release of two lines (output-wise, then per-step)."""
    split = Split((np.random.default_rng(1).integers(0, 256, size=(24, 1, 4, 4))).astype(np.uint8),
                  np.zeros(24, dtype=np.int64))
    trajectories(split, zero_denoiser, p_percent=55, B=6, T=2, beta=1.0, accounting=ACCOUNTING, n_rows=2, seed=0,
                 sink=sink(path), device=torch.device("cpu"))


def accounting_section(**overrides) -> dict:
    return {**ACCOUNTING, "n": 500, "B": [10], "p": [55.0], "N_out": 20, "C_scales_with_subset": True,
            "mu_bar_B": [0.9], **overrides}


def write_configuration_claims(path: Path, **overrides) -> None:
    """The ``empden_blocks`` stage's claims: the (p, B) grid and a mu_bar_B given directly (App. G)."""
    accounting.empden_blocks({}, {"blocks": path.with_suffix(".blocks.json"), "ledger": path},
                             {"accounting": accounting_section(**overrides), "config_id": "c", "seed": 0})


def write_dpsgd_poisson(path: Path) -> None:
    """DPDM's DP-SGD with Poisson sampling (add/remove, PLD)."""
    plan = dpsgd.DPSGDPlan(noise_multiplier=1.3, max_grad_norm=0.5, sampling_rate=8 / 40, dataset_size=40, steps=6,
                           delta=DELTA)
    ledger.append_entry(path, dpsgd.ledger_entry(plan, stage="train_dpdm", config_id="c", seed=0, settings=COARSE))


def write_dpsgd_fixed_size(path: Path) -> None:
    """DP-SGD with fixed-size batches without replacement (replace-one, RDP)."""
    plan = dpsgd.DPSGDPlan(noise_multiplier=2.0, max_grad_norm=0.5, sampling_rate=0.1, dataset_size=100, steps=5,
                           delta=DELTA, sampling="fixed_size")
    ledger.append_entry(path, dpsgd.ledger_entry(plan, stage="train_dpdm", config_id="c", seed=0))


def write_moment_release(path: Path) -> None:
    """STRAIGHTDP Stage 1 (Prop. B.9): two Gaussians of one multiplier, on u (sensitivity 2) and M2 (2R^2/N)."""
    plan = moments.MomentReleasePlan(sigma=2.5, R=1.2, N=500, n_classes=10, p=8, delta=DELTA)
    ledger.append_entry(path, moments.ledger_entry(plan, stage="release_moments", config_id="c", seed=0,
                                                   settings=COARSE))


def write_tha_dpsgd(path: Path) -> None:
    """STRAIGHTDP Stage 2 (Sec. 3.2): THA DP-SGD, K buckets of their own clip under one noise std s."""
    plan = tha.THAPlan(edges=(0.2, 0.6, 1.0), clips=(0.5, 1.5), noise_std=1.2, sampling_rate=8 / 40, dataset_size=40,
                       steps=6, delta=DELTA, beta=1.0)
    ledger.append_entry(path, tha.ledger_entry(plan, stage="train_straightdp", config_id="c", seed=0, settings=COARSE))


def write_dp_merf(path: Path) -> None:
    """DP-MERF (Harder et al. 2021): one Gaussian on the mean embedding, sensitivity 2/m (replace-one)."""
    plan = dp_merf.MerfReleasePlan(sigma=2.0, m=500, n_features=16, n_classes=10, delta=DELTA)
    ledger.append_entry(path, dp_merf.ledger_entry(plan, stage="dp_merf", config_id="c", seed=0, settings=COARSE))


def write_pe_histogram(path: Path) -> None:
    """Private Evolution (Lin et al. 2024): T Gaussians on the vote histogram, sensitivity 1."""
    plan = private_evolution.PEHistogramPlan(sigma=5.0, T=4, delta=DELTA)
    ledger.append_entry(path, private_evolution.ledger_entry(plan, stage="private_evolution", config_id="c", seed=0,
                                                             settings=COARSE))


def write_text_moment_release(path: Path) -> None:
    """STRAIGHTDP's text-conditional release (eq. 5, Prop. B.10): one Gaussian, sensitivity 2 sqrt(2)/N."""
    plan = text_moments.TextReleasePlan(sigma=2.0, R=1.2, R_txt=1.0, N=500, p=8, q=12, delta=DELTA)
    ledger.append_entry(path, text_moments.ledger_entry(plan, stage="release_text_moments", config_id="c", seed=0,
                                                        settings=COARSE))


WRITERS: dict[str, Callable[[Path], None]] = {
    "hybrid": write_hybrid, "per_step": write_per_step, "full_batch": write_full_batch, "figure2": write_figure2,
    "configuration_claims": write_configuration_claims, "dpsgd_poisson": write_dpsgd_poisson,
    "dpsgd_fixed_size": write_dpsgd_fixed_size, "moment_release": write_moment_release,
    "tha_dpsgd": write_tha_dpsgd, "dp_merf": write_dp_merf, "pe_histogram": write_pe_histogram,
    "text_moment_release": write_text_moment_release,
}


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> dict[str, Path]:
    """One transcript per writer, written once (tests copy before editing)."""
    root = tmp_path_factory.mktemp("genuine")
    for name, write in WRITERS.items():
        write(root / f"{name}.jsonl")
    return {name: root / f"{name}.jsonl" for name in WRITERS}


def copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "a.jsonl"
    dst.write_bytes(src.read_bytes())
    return dst


def edit(path: Path, line: int, change: Callable[[dict], None]) -> None:
    lines = path.read_text().splitlines()
    record = json.loads(lines[line])
    change(record)
    lines[line] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")


def n_lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def run_replay(tmp_path: Path, **transcripts: Path) -> dict:
    out = tmp_path / "replay.json"
    replay(transcripts, {"report": out}, {"config_id": "c"})
    return json.loads(out.read_text())


# --------------------------------------------------------------------------- honest transcripts pass

def test_every_mechanism_the_pipeline_writes_has_a_rebuilder_and_a_writer_here(genuine):
    """A new mechanism must register a rebuilder (else its lines fail the replay) and be tested here."""
    written = set()
    for source in PIPELINE_SOURCE.rglob("*.py"):
        written |= set(re.findall(r'mechanism="([a-z_0-9]+)"', source.read_text()))
    assert written and written <= set(rebuild.REBUILDERS)
    covered = {e.mechanism for path in genuine.values() for _, e in ledger.read_ledger(path)}
    assert covered == set(rebuild.REBUILDERS)


@pytest.mark.parametrize("name", WRITERS)
def test_a_genuine_line_is_rebuilt_from_its_parameters_and_replays(genuine, tmp_path, name):
    report = run_replay(tmp_path, a=genuine[name])
    assert report["all_ok"] and report["n_claims"] == n_lines(genuine[name]) >= 1
    assert all(c["ok"] and c["event_rebuilt"] for c in report["claims"])
    assert report["transcripts"] == [{"name": "a", "transcript": str(genuine[name]), "n_claims": report["n_claims"],
                                      "expected_claims": None, "ok": True}]
    for _, entry in ledger.read_ledger(genuine[name]):
        assert rebuild.mismatches(entry, rebuild.rebuild(entry)) == []


def test_configuration_claims_rebuild_the_accounting_tables_mu_bar(genuine):
    """The grid block's mu_bar_B (eq. 9, C scaled with the subset) is what the rebuild derives from its line."""
    cfg = accounting.AccountingConfig.from_params({"accounting": accounting_section()})
    entries = [e for _, e in ledger.read_ledger(genuine["configuration_claims"])]
    assert [e.extra["source"] for e in entries] == ["schedule", "given"]
    for row, entry in zip(accounting.block_plan(cfg), entries):
        assert rebuild.rebuild(entry).fields["extra.mu_bar_B"] == pytest.approx(row["mu_bar_B"], rel=1e-12)


def test_expected_claims_are_checked_per_transcript_and_reported(genuine, tmp_path):
    out = tmp_path / "r.json"
    replay({"blocks": genuine["configuration_claims"], "fig2": genuine["figure2"]}, {"report": out},
           {"expected_claims": {"blocks": 2, "fig2": 2}})
    report = json.loads(out.read_text())
    assert report["all_ok"] and report["n_claims"] == 4
    assert [(t["name"], t["n_claims"], t["expected_claims"], t["ok"]) for t in report["transcripts"]] == [
        ("blocks", 2, 2, True), ("fig2", 2, 2, True)]


# --------------------------------------------------------------------------- a tampered event fails

def weaken_event(record: dict) -> None:
    """Double every noise multiplier and halve every sampling rate in the event, keep every parameter.

    The derived fields (noise std, the line's noise multiplier and sampling probability) are
    edited along, so the line is self-consistent and the claim is set to what the weakened
    event certifies: only rebuilding the event from the parameters can catch it.
    """
    def walk(node):
        if isinstance(node, dict):
            if "noise_multiplier" in node:
                node["noise_multiplier"] *= 2
            if "sampling_probability" in node:
                node["sampling_probability"] /= 2
            if "sample_size" in node:
                node["sample_size"] //= 2
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(record["event"])
    record["noise_std"] *= 2
    record["noise_multiplier"] *= 2
    if "probability" in record["sampling"]:
        record["sampling"]["probability"] /= 2
    record["claimed_epsilon"] = recompute(ledger.LedgerEntry.from_dict(record))


@pytest.mark.parametrize("name", WRITERS)
def test_an_event_weakened_behind_its_parameters_fails(genuine, tmp_path, name):
    path = copy(genuine[name], tmp_path)
    last = n_lines(path) - 1
    edit(path, last, weaken_event)
    (_, tampered), = [(n, e) for n, e in ledger.read_ledger(path) if n == last + 1]  # still a well-formed line
    with pytest.raises(ReplayError, match=rf"a\.jsonl:{last + 1}: mechanism '{tampered.mechanism}': event\..* "
                                          r"the parameters give .*does not match the line's mechanism parameters"):
        run_replay(tmp_path, a=path)
    assert not (tmp_path / "replay.json").exists()


def test_the_issue_example_halved_mu_bar_and_q_at_b_over_n_0p02_fails(tmp_path):
    """Issue #13: mu_bar_B and q halved in the event while the line still says B/n = 0.02."""
    path = tmp_path / "a.jsonl"
    write_configuration_claims(path, p=[65.0], N_out=1000, mu_bar_B=None)  # B/n = 10/500
    honest = json.loads(path.read_text())
    assert honest["sampling"]["B"] / honest["sampling"]["n"] == 0.02

    def halve(record):
        event = record["event"]["event"]
        event["sampling_probability"] /= 2
        event["event"]["noise_multiplier"] *= 2
        record["noise_std"] *= 2
        record["noise_multiplier"] *= 2
        record["sampling"]["probability"] /= 2
        record["extra"]["mu_bar_B"] /= 2
        record["claimed_epsilon"] = recompute(ledger.LedgerEntry.from_dict(record))

    edit(path, 0, halve)
    (_, tampered), = ledger.read_ledger(path)
    assert honest["claimed_epsilon"] > 3 * tampered.claimed_epsilon  # the edit hides most of the privacy loss
    found = rebuild.mismatches(tampered, rebuild.rebuild(tampered))
    assert "event.event.sampling_probability is 0.01, the parameters give 0.02" in found
    assert any(m.startswith("extra.mu_bar_B is") for m in found)
    with pytest.raises(ReplayError, match=r"a\.jsonl:1: mechanism 'empden_outputwise_block': event\.event\.event\."
                                          r"noise_multiplier is .*, the parameters give .* \(\+\d+ more\)"):
        run_replay(tmp_path, a=path)


# --------------------------------------------------------------------------- a tampered parameter fails

PARAMETERS = {
    "hybrid": ["extra.C", "extra.beta", "extra.k_steps", "extra.sigma_min", "extra.sigma_max", "extra.rho",
               "extra.N", "sampling.B", "sampling.n"],
    "per_step": ["extra.C", "extra.k_steps", "sampling.B", "sampling.n"],
    "full_batch": ["extra.C", "extra.beta", "extra.k_steps", "extra.sigma_min", "sampling.n"],
    "configuration_claims": ["extra.C", "extra.k_steps", "sampling.B", "sampling.n"],
    "dpsgd_poisson": ["extra.dpsgd_noise_multiplier", "extra.max_grad_norm", "extra.expected_batch_size",
                      "sampling.n"],
    "dpsgd_fixed_size": ["extra.dpsgd_noise_multiplier", "extra.max_grad_norm", "sampling.B", "sampling.n"],
}


@pytest.mark.parametrize("name, path_in_line", [(n, p) for n, ps in PARAMETERS.items() for p in ps])
def test_a_parameter_edited_without_its_event_fails(genuine, tmp_path, name, path_in_line):
    path = copy(genuine[name], tmp_path)
    section, key = path_in_line.split(".")

    def change(record):
        value = record[section][key]
        record[section][key] = value + 1 if isinstance(value, int) else value * 1.5

    edit(path, 0, change)
    with pytest.raises(ReplayError, match=r"a\.jsonl:1: mechanism '\w+': .*(does not match the line's mechanism "
                                          r"parameters|build no valid mechanism)"):
        run_replay(tmp_path, a=path)


def test_a_line_missing_a_parameter_fails_naming_it(genuine, tmp_path):
    path = copy(genuine["hybrid"], tmp_path)
    edit(path, 0, lambda r: r["extra"].pop("sigma_min"))
    with pytest.raises(ReplayError, match=r"a\.jsonl:1: mechanism 'empden_outputwise_block': the line lacks "
                                          r"parameter extra\.sigma_min"):
        run_replay(tmp_path, a=path)


def test_a_mechanism_without_a_rebuilder_fails(genuine, tmp_path):
    path = copy(genuine["hybrid"], tmp_path)
    edit(path, 0, lambda r: r.update(mechanism="gaussian"))
    with pytest.raises(ReplayError, match=r"a\.jsonl:1: mechanism 'gaussian' has no registered rebuilder"):
        run_replay(tmp_path, a=path)


def test_floats_equal_up_to_rounding_are_the_same_event_but_a_real_difference_is_not(genuine):
    (_, entry), = ledger.read_ledger(genuine["hybrid"])
    mu_bar, q = entry.extra["mu_bar_B"], entry.sampling["probability"]

    def differences(rel: float) -> list[str]:
        return rebuild.mismatches(entry, rebuild.Expected(acc.outputwise_event(mu_bar, q * (1 + rel), entry.count), {}))

    assert differences(0.0) == [] and differences(1e-13) == []
    assert differences(1e-6) == [f"event.event.sampling_probability is {q!r}, the parameters give {q * (1 + 1e-6)!r}"]


# --------------------------------------------------------------------------- claims the eps cannot back

def test_an_understated_claim_fails(genuine, tmp_path):
    path = copy(genuine["configuration_claims"], tmp_path)
    edit(path, 1, lambda r: r.update(claimed_epsilon=r["claimed_epsilon"] * 0.9))
    with pytest.raises(ReplayError, match=r"a\.jsonl:2: claimed eps .* < recomputed certified eps"):
        run_replay(tmp_path, a=path)


def test_noise_switched_off_fails(genuine, tmp_path):
    path = copy(genuine["hybrid"], tmp_path)

    def no_noise(r):
        r["event"]["event"]["event"]["noise_multiplier"] = 0.0
        r["noise_std"] = r["noise_multiplier"] = 0.0

    edit(path, 0, no_noise)
    with pytest.raises(ReplayError, match=r"noise_multiplier is 0\.0, .*does not match the line's mechanism "
                                          r"parameters \(\+1 more"):
        run_replay(tmp_path, a=path)


def test_a_field_edited_without_the_event_is_refused(genuine, tmp_path):
    path = copy(genuine["hybrid"], tmp_path)
    edit(path, 0, lambda r: r.update(noise_std=r["noise_std"] * 3, noise_multiplier=r["noise_multiplier"] * 3))
    with pytest.raises(ReplayError, match="matches no Gaussian"):
        run_replay(tmp_path, a=path)


# --------------------------------------------------------------------------- missing, empty and cut transcripts

def test_an_empty_transcript_fails(tmp_path):
    path = tmp_path / "train_dpdm_run.jsonl"
    path.write_text("")
    with pytest.raises(ReplayError, match=r"train_dpdm_run\.jsonl: empty transcript \(0 claims\)"):
        run_replay(tmp_path, a=path)


def test_a_transcript_cut_mid_line_fails(genuine, tmp_path):
    path = copy(genuine["figure2"], tmp_path)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(ReplayError, match=r"a\.jsonl:2: truncated transcript"):
        run_replay(tmp_path, a=path)


def test_a_last_line_without_its_newline_fails_even_if_it_parses(genuine, tmp_path):
    path = copy(genuine["figure2"], tmp_path)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ReplayError, match=r"a\.jsonl:2: truncated transcript"):
        run_replay(tmp_path, a=path)


def test_a_transcript_cut_at_a_line_boundary_fails_its_expected_count(genuine, tmp_path):
    path = copy(genuine["figure2"], tmp_path)
    path.write_text(path.read_text().splitlines(keepends=True)[0])
    assert run_replay(tmp_path, a=path)["all_ok"]  # one whole line is a valid transcript on its own ...
    with pytest.raises(ReplayError, match=r"a\.jsonl: 1 claim\(s\), expected 2"):  # ... but not Figure 2's
        replay({"fig2": path}, {"report": tmp_path / "r.json"}, {"expected_claims": {"fig2": 2}})


def test_a_transcript_of_a_private_stage_that_ran_but_was_not_handed_in_fails(genuine, tmp_path):
    with pytest.raises(ReplayError, match=r"transcript 'train_dpdm_run' of a private stage that ran was not handed "
                                          r"in"):
        replay({"blocks": genuine["configuration_claims"]}, {"report": tmp_path / "r.json"},
               {"expected_claims": {"blocks": 2, "train_dpdm_run": 1}})


def test_a_transcript_whose_file_is_missing_fails(tmp_path):
    with pytest.raises(ReplayError, match=r"nope\.jsonl: transcript 'a' not found"):
        run_replay(tmp_path, a=tmp_path / "nope.jsonl")


def test_a_transcript_not_declared_in_expected_claims_fails(genuine, tmp_path):
    with pytest.raises(ReplayError, match=r"transcript 'extra' .* is not in expected_claims"):
        replay({"extra": genuine["hybrid"]}, {"report": tmp_path / "r.json"}, {"expected_claims": {}})


def test_every_failure_is_counted_in_the_one_line_message(genuine, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ReplayError, match=r"empty transcript.*\(\+1 more, see the log\)$") as err:
        replay({"e": empty, "m": tmp_path / "missing.jsonl"}, {"report": tmp_path / "r.json"}, {})
    assert "\n" not in str(err.value)


def test_no_transcripts_fail_unless_the_config_states_no_private_stage_ran(tmp_path):
    with pytest.raises(ReplayError, match="no ledger transcripts given"):
        replay({}, {"report": tmp_path / "r.json"}, {})
    replay({}, {"report": tmp_path / "r.json"}, {"expected_claims": {}})
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["all_ok"] and report["n_claims"] == 0 and report["transcripts"] == []


@pytest.mark.parametrize("expected", [{"a": 0}, {"a": -1}, {"a": 1.5}, {"a": True}, [1]])
def test_bad_expected_claims_are_a_one_line_error(genuine, tmp_path, expected):
    with pytest.raises(PipelineError, match="params.expected_claims"):
        replay({"a": genuine["hybrid"]}, {"report": tmp_path / "r.json"}, {"expected_claims": expected})


def test_audit_returns_the_claims_and_one_summary_per_transcript(genuine):
    claims, summaries = audit({"blocks": genuine["configuration_claims"]}, {"blocks": 2})
    assert [c["line"] for c in claims] == [1, 2] and summaries[0]["ok"]
