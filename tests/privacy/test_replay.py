"""Replay: every claim recomputed from the transcripts alone, every event rebuilt from its line's parameters.

Each mechanism writes its line here through its own code (the samplers, the accounting stage,
DP-SGD); the replay must pass those, and must fail when an event no longer matches the
parameters next to it, when a parameter is edited, when a transcript is missing, empty or
cut off, or when a mechanism has no rebuilder.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.methods.accounting import blocks as accounting
from pipeline.privacy.replay import Registered, ReplayError, audit, recompute, replay
from pipeline.config import validate_config
from pipeline.io import Split
from pipeline.privacy import accountants as acc
from pipeline.privacy import (dp_merf, dpsgd, ledger, mean_embedding, moments, private_evolution, rebuild,
                              semantic_histogram, text_moments, tha)
from pipeline.privacy import empirical_denoiser as emp
from pipeline.privacy.schedule import EDMSchedule
from pipeline.sampling import empirical as empden
from pipeline.methods.empden.sample_stage import trajectories
from pipeline.stage import PipelineError
from tests.ledgers import EXPERIMENT, SPLIT_SHA, bind, registration, split_file
from tests.ledgers import replay_stage as run_replay

#: the coarsest settings the replay accepts (its MAX_DISCRETISATION, MAX_LOG_MASS_TRUNCATION): test speed
COARSE = acc.PLDSettings(1e-3, -50.0)
DELTA = 1e-5
SCHEDULE = EDMSchedule(N=12)
#: the config's accounting section on a short grid and a coarse PLD (speed only)
ACCOUNTING = {**validate_config({})["accounting"], "discretisation": 1e-3, "log_mass_truncation": -50.0,
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
                             {"accounting": accounting_section(**overrides), "config_id": "c", "seed": 0,
                              "ledger_binding": {"run": "empden_blocks", "experiment": EXPERIMENT}})


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


def write_mean_embeddings(path: Path) -> None:
    """DP-HP, DP-NTK, DP-MEPF (DP-MERF's successors): one Gaussian each on a mean embedding of rows of norm <= 1
    (one transcript of one stage here; the pipeline writes each to its own run's)."""
    for mechanism in mean_embedding.MECHANISMS:
        plan = mean_embedding.EmbeddingReleasePlan(mechanism=mechanism, sigma=2.0, m=500, feature_dim=32, n_classes=10,
                                                   delta=DELTA)
        ledger.append_entry(path, mean_embedding.ledger_entry(plan, stage="embedding_baseline", config_id="c", seed=0,
                                                              settings=COARSE))


def write_semantic_histogram(path: Path) -> None:
    """PrivImage's semantic query (Li et al. 2024): one Gaussian on the class-by-semantics votes, sensitivity sqrt(k)."""
    plan = semantic_histogram.SemanticQueryPlan(sigma=20.0, k=2, delta=DELTA)
    ledger.append_entry(path, semantic_histogram.ledger_entry(plan, stage="privimage_select", config_id="c", seed=0,
                                                              settings=COARSE))


WRITERS: dict[str, Callable[[Path], None]] = {
    "hybrid": write_hybrid, "per_step": write_per_step, "full_batch": write_full_batch, "figure2": write_figure2,
    "configuration_claims": write_configuration_claims, "dpsgd_poisson": write_dpsgd_poisson,
    "dpsgd_fixed_size": write_dpsgd_fixed_size, "moment_release": write_moment_release,
    "tha_dpsgd": write_tha_dpsgd, "dp_merf": write_dp_merf, "pe_histogram": write_pe_histogram,
    "text_moment_release": write_text_moment_release, "mean_embeddings": write_mean_embeddings,
    "semantic_histogram": write_semantic_histogram,
}


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> dict[str, Path]:
    """One transcript per writer, bound to the run named after it, written once (tests copy before editing)."""
    root = tmp_path_factory.mktemp("genuine")
    for name, write in WRITERS.items():
        write(root / f"{name}.jsonl")
        if name != "configuration_claims":  # the accounting stage binds its own (no data read)
            bind(root / f"{name}.jsonl", run=name)
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
    run = "empden_blocks" if name == "configuration_claims" else name
    assert report["transcripts"] == [{"name": "a", "transcript": str(genuine[name]), "n_claims": report["n_claims"],
                                      "expected_claims": report["n_claims"], "run": run, "ok": True}]
    assert [c["seq"] for c in report["claims"]] == list(range(report["n_claims"]))
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
    report = run_replay(tmp_path, blocks=genuine["configuration_claims"], fig2=genuine["figure2"])
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
    # three failures: the rebuild, "cannot certify", and the claim not covered by the infinite eps
    with pytest.raises(ReplayError, match=r"noise_multiplier is 0\.0, .*does not match the line's mechanism "
                                          r"parameters \(\+2 more"):
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
        run_replay(tmp_path, expected={"fig2": registration(path, split_file(tmp_path), claims=2)}, fig2=path)


def test_a_transcript_of_a_private_stage_that_ran_but_was_not_handed_in_fails(genuine, tmp_path):
    with pytest.raises(ReplayError, match=r"transcript 'train_dpdm_run' of a private stage that ran was not handed "
                                          r"in"):
        blocks = genuine["configuration_claims"]
        run_replay(tmp_path, blocks=blocks, expected={"blocks": registration(blocks, split_file(tmp_path)),
                                                      "train_dpdm_run": registration(genuine["dpsgd_poisson"],
                                                                                     split_file(tmp_path))})


def test_a_transcript_whose_file_is_missing_fails(tmp_path):
    with pytest.raises(ReplayError, match=r"nope\.jsonl: transcript 'a' not found"):
        run_replay(tmp_path, a=tmp_path / "nope.jsonl")


def test_a_transcript_not_declared_in_the_expected_transcripts_fails(genuine, tmp_path):
    with pytest.raises(ReplayError, match=r"transcript 'extra' .* is not in the expected transcripts"):
        run_replay(tmp_path, expected={}, extra=genuine["hybrid"])


def test_every_failure_is_counted_in_the_one_line_message(genuine, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ReplayError, match=r"empty transcript.*\(\+1 more, see the log\)$") as err:
        run_replay(tmp_path, e=empty, m=tmp_path / "missing.jsonl")
    assert "\n" not in str(err.value)


def test_no_transcripts_fail_unless_the_config_states_no_private_stage_ran(tmp_path):
    with pytest.raises(ReplayError, match="no ledger transcripts given"):
        audit({})
    run_replay(tmp_path, expected={})
    report = json.loads((tmp_path / "replay.json").read_text())
    assert report["all_ok"] and report["n_claims"] == 0 and report["transcripts"] == []


def test_the_stage_certifies_nothing_without_the_registrys_expectations(genuine, tmp_path):
    """Issue #35: called from the command line without the registry's counts, a transcript one line short would
    pass; the stage refuses to certify instead (the workflow's rule replay passes them)."""
    short = copy(genuine["figure2"], tmp_path)
    short.write_text(short.read_text().splitlines(keepends=True)[0])
    for params in ({"config_id": "c"}, {"config_id": "c", "experiment": EXPERIMENT}):
        with pytest.raises(PipelineError, match=r"^replay: params.expected is required.*nothing is certified"):
            replay({"fig2": short}, {"report": tmp_path / "r.json"}, params)
    with pytest.raises(PipelineError, match=r"^replay: params.experiment must be"):
        replay({"fig2": short}, {"report": tmp_path / "r.json"}, {"expected": {}})
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("claims", [0, -1, 1.5, True])
def test_bad_expected_claims_are_a_one_line_error(genuine, tmp_path, claims):
    with pytest.raises(PipelineError, match=r"params.expected.a.claims must be an integer >= 1"):
        run_replay(tmp_path, expected={"a": registration(genuine["hybrid"], split_file(tmp_path), claims=claims)},
                   a=genuine["hybrid"])


@pytest.mark.parametrize("spec, message", [([1], r"params.expected.a must hold exactly claims, run"),
                                           ({"claims": 1}, r"params.expected.a must hold exactly"),
                                           ("delta", r"params.expected.a.delta must be in \(0, 1\)")])
def test_a_malformed_registration_is_a_one_line_error(genuine, tmp_path, spec, message):
    if spec == "delta":
        spec = registration(genuine["hybrid"], split_file(tmp_path), delta=2.0)
    with pytest.raises(PipelineError, match=message):
        run_replay(tmp_path, expected={"a": spec}, a=genuine["hybrid"])


def test_audit_returns_the_claims_and_one_summary_per_transcript(genuine):
    claims, summaries = audit({"blocks": genuine["configuration_claims"]}, {"blocks": Registered(2, configuration=True)})
    assert [c["line"] for c in claims] == [1, 2] and summaries[0]["ok"]


# --------------------------------------------------------------------------- issue #35: lines that cannot be bounded

def weakened_dpsgd_line(path: Path, truncation: float) -> ledger.LedgerEntry:
    """A DP-SGD line whose sigma was halved consistently (event, fields, parameters), its claim left at the
    honest run's eps, recorded with PLD truncation bound ``truncation``."""
    honest = dpsgd.DPSGDPlan(noise_multiplier=1.0, max_grad_norm=1.0, sampling_rate=0.05, dataset_size=1000,
                             steps=200, delta=DELTA)
    claim = dpsgd.ledger_entry(honest, stage="train_dpdm", config_id="c", seed=0, settings=COARSE).claimed_epsilon
    halved = dataclasses.replace(honest, noise_multiplier=0.5)
    entry = dpsgd.ledger_entry(halved, stage="train_dpdm", config_id="c", seed=0,
                               settings=acc.PLDSettings(1e-3, truncation))
    entry = dataclasses.replace(entry, claimed_epsilon=claim)
    ledger.append_entry(path, entry, ledger.Binding(run="r", experiment=EXPERIMENT, data_sha256=SPLIT_SHA))
    return entry


def test_a_line_whose_recomputed_eps_is_infinite_fails_the_stage(tmp_path, caplog):
    """The audit's forgery: sigma halved, claim kept (4.77, true eps 24.7), truncation bound -10: the recomputed
    eps is +inf, which the replay recorded as not ok while the rule exited 0. Now the stage fails, naming both the
    uncovered claim and the loose setting."""
    path = tmp_path / "a.jsonl"
    entry = weakened_dpsgd_line(path, truncation=-10.0)
    assert recompute(entry) == float("inf")
    with pytest.raises(ReplayError, match=r"a\.jsonl:1: PLD log mass truncation bound -10\.0 is looser than the "
                                          r"project's \(at most -50\) \(\+1 more"):
        run_replay(tmp_path, a=path)
    assert any("claimed eps 4.76619 < recomputed certified eps inf" in r.message for r in caplog.records)
    assert not (tmp_path / "replay.json").exists()


def test_the_same_forgery_at_the_projects_settings_fails_on_its_claim(tmp_path):
    path = tmp_path / "a.jsonl"
    weakened_dpsgd_line(path, truncation=-50.0)
    with pytest.raises(ReplayError, match=r"a\.jsonl:1: claimed eps 4\.766\d* < recomputed certified eps 24\.7"):
        run_replay(tmp_path, a=path)


@pytest.mark.parametrize("field, value, message", [
    ("value_discretization_interval", 1e-2, r"PLD discretisation 0\.01 is looser than the project's \(at most 0\.001\)"),
    ("log_mass_truncation_bound", -20.0, r"PLD log mass truncation bound -20\.0 is looser"),
    ("log_mass_truncation_bound", None, r"PLD log mass truncation bound None is looser")])
def test_accountant_settings_looser_than_the_projects_are_refused(genuine, tmp_path, field, value, message):
    path = copy(genuine["dpsgd_poisson"], tmp_path)
    edit(path, 0, lambda r: r["accountant"].update({field: value}))
    with pytest.raises(ReplayError, match=rf"a\.jsonl:1: {message}"):
        run_replay(tmp_path, a=path)


# --------------------------------------------------------------------------- issue #35: forgeries

def test_a_sampler_line_relabelled_given_with_mu_bar_halved_fails(genuine, tmp_path):
    """extra.source = 'given' used to skip the schedule rebuild: mu_bar_B halved and the claim recomputed from it
    (0.389 -> 0.181 in the audit) passed the replay and the one-run audit. Only configuration claims may be given."""
    path = copy(genuine["hybrid"], tmp_path)

    def relabel(r):
        mu, q, count = r["extra"]["mu_bar_B"] / 2, r["sampling"]["probability"], r["count"]
        r["extra"].update(source="given", mu_bar_B=mu)
        r["event"] = ledger.event_to_dict(acc.outputwise_event(mu, q, count))
        r["noise_multiplier"], r["noise_std"] = 1 / mu, r["sensitivity"] / mu
        r["claimed_epsilon"] = recompute(ledger.LedgerEntry.from_dict(r))

    honest = json.loads(path.read_text())["claimed_epsilon"]
    edit(path, 0, relabel)
    (_, forged), = ledger.read_ledger(path)
    rebuild.check(forged)  # arithmetic alone cannot tell: the given branch rebuilds what it is told
    assert forged.claimed_epsilon < honest / 1.5
    with pytest.raises(ReplayError, match=r"a\.jsonl:1: carries a mu_bar_B given directly \(extra\.source = 'given'\), "
                                          r"which only the accounting tables' configuration claims may"):
        run_replay(tmp_path, a=path)


def test_the_accounting_tables_configuration_claims_may_carry_given(genuine, tmp_path):
    assert run_replay(tmp_path, a=genuine["configuration_claims"])["all_ok"]
    with pytest.raises(ReplayError, match=r"carries a mu_bar_B given directly"):
        audit({"a": genuine["configuration_claims"]}, {"a": 2})  # not registered as configuration claims


def test_a_delta_changed_on_a_line_fails(genuine, tmp_path):
    """delta 1e-5 -> 1e-2 with the claim recomputed at it (0.999 -> 0.314 in the audit): self-consistent, but not the
    method's configured delta."""
    path = copy(genuine["dpsgd_poisson"], tmp_path)
    registered = registration(path, split_file(tmp_path))

    def loosen(r):
        r["delta"] = 1e-2
        r["claimed_epsilon"] = recompute(ledger.LedgerEntry.from_dict(r))

    edit(path, 0, loosen)
    with pytest.raises(ReplayError, match=r"a\.jsonl:1: delta is 0\.01, the method's configured delta is 1e-05"):
        run_replay(tmp_path, expected={"a": registered}, a=path)


def test_a_transcript_swapped_between_two_runs_fails(genuine, tmp_path):
    """Each run's transcript is registered for its run: handing run A's transcript in for run B fails."""
    data = split_file(tmp_path)
    a, b = genuine["dpsgd_poisson"], genuine["tha_dpsgd"]
    expected = {"a": registration(a, data), "b": registration(b, data)}
    assert run_replay(tmp_path, expected=expected, a=a, b=b)["all_ok"]
    with pytest.raises(ReplayError, match=r"tha_dpsgd\.jsonl:1: run is 'tha_dpsgd', the transcript is registered for "
                                          r"'dpsgd_poisson'"):
        run_replay(tmp_path, expected=expected, a=b, b=a)


def test_a_line_handed_in_twice_fails(genuine, tmp_path):
    """Twice in one transcript (its seq repeats), or one transcript under two names (the same line twice)."""
    path = copy(genuine["dpsgd_poisson"], tmp_path)
    path.write_text(path.read_text() * 2)
    with pytest.raises(ReplayError, match=r"a\.jsonl:2: the same line as .*a\.jsonl:1 .*\(\+1 more"):
        run_replay(tmp_path, expected={"a": registration(path, split_file(tmp_path), claims=2)}, a=path)
    with pytest.raises(ReplayError, match=r"a\.jsonl:2: the same line as .*a\.jsonl:1 \(one release: .*\(\+1 more"):
        # a copy whose volatile fields differ is the same release still: its identity (run, experiment, stage, phase,
        # seq) repeats, and its seq is not its position
        edit(path, 1, lambda r: r.update(time_utc="2026-01-01T00:00:00+00:00"))
        audit({"a": path}, {"a": Registered(2, run="dpsgd_poisson", experiment=EXPERIMENT, stage="train_dpdm",
                                            delta=DELTA, data_sha256=SPLIT_SHA)})
    one = genuine["dpsgd_poisson"]
    with pytest.raises(ReplayError, match=r"the same line as"):
        spec = registration(one, split_file(tmp_path))
        run_replay(tmp_path, expected={"x": spec, "y": spec}, x=one, y=one)


def test_a_line_deleted_from_the_middle_of_a_transcript_fails_even_at_the_right_count(genuine, tmp_path):
    """Figure 2's two lines: the first deleted and the second written twice keeps the count; the seq does not."""
    path = copy(genuine["figure2"], tmp_path)
    second = path.read_text().splitlines(keepends=True)[1]
    path.write_text(second)
    with pytest.raises(ReplayError, match=r"a\.jsonl:1: seq is 1, it is line 1 of its transcript"):
        run_replay(tmp_path, a=path)


@pytest.mark.parametrize("what, message", [
    ("experiment", r"experiment is 'exp', the transcript is registered for 'other'"),
    ("data", r"data_sha256 is '5555.*', the transcript is registered for 'eeee"),
    ("stage", r"stage is 'train_dpdm', the transcript is registered for 'release_moments'")])
def test_a_line_bound_elsewhere_fails(genuine, tmp_path, what, message):
    """Another experiment's transcript, one written on another private split, one of another stage of the run."""
    path = genuine["dpsgd_poisson"]
    spec = registration(path, split_file(tmp_path, "e" * 64) if what == "data" else split_file(tmp_path))
    if what == "stage":
        spec["stage"] = "release_moments"
    out = tmp_path / "replay.json"
    experiment = "other" if what == "experiment" else EXPERIMENT
    with pytest.raises(ReplayError, match=rf"dpsgd_poisson\.jsonl:1: {message}"):
        replay({"a": path}, {"report": out}, {"config_id": "c", "experiment": experiment, "expected": {"a": spec}})


def test_an_unbound_line_fails_a_bound_registration(tmp_path):
    """A line written without its stage's ledger_binding (run '', seq -1) is not where any run's transcript is."""
    path = tmp_path / "a.jsonl"
    write_dpsgd_poisson(path)
    with pytest.raises(ReplayError, match=r"a\.jsonl:1: run is '', the transcript is registered for 'r'"):
        run_replay(tmp_path, expected={"a": registration(path, split_file(tmp_path), run="r")}, a=path)
