"""The summary page (results/index.html, the report's first page) states the ledger replay's verdict: passed or failed, claims per transcript, failures.

The replay report is produced by the real ``replay`` stage from a DP-SGD transcript where the
test can afford it; reports the stage would refuse to write (failures, contradictions, the
older format) are written by hand to check the page reads them by key and never shows a pass
the report contradicts.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from tests.ledgers import bind, replay_stage
from pipeline.io import write_json
from pipeline.privacy import accountants as acc
from pipeline.privacy import dpsgd, ledger
from pipeline.reporting.review import index_html
from pipeline.reporting.verdict import replay_verdict
from pipeline.stage import PipelineError


def verdict_section(page: str) -> str:
    match = re.search(r"<section id='replay'.*?</section>", page, flags=re.S)
    assert match, "the index page has no replay section"
    return match.group(0)


def render(tmp_path: Path, report: Path | None) -> str:
    inputs = {} if report is None else {"replay": report}
    index_html(inputs, {"index": tmp_path / "index.html", "fragment": tmp_path / "summary.html"}, {"title": "unit"})
    return (tmp_path / "index.html").read_text()


@pytest.fixture(scope="module")
def genuine_report(tmp_path_factory) -> Path:
    """A replay report written by the replay stage: two transcripts with 2 and 1 DP-SGD claims."""
    root = tmp_path_factory.mktemp("replay")
    plan = dpsgd.DPSGDPlan(noise_multiplier=1.3, max_grad_norm=0.5, sampling_rate=8 / 40, dataset_size=40, steps=6,
                           delta=1e-5)
    coarse = acc.PLDSettings(1e-3, -50.0)  # test speed only: the coarsest the replay accepts
    for name, seeds in (("train_dpdm_eps1", (0, 1)), ("train_dpdm_eps10", (0,))):
        for seed in seeds:
            ledger.append_entry(root / f"{name}.jsonl", dpsgd.ledger_entry(plan, stage="train_dpdm", config_id="c",
                                                                           seed=seed, settings=coarse))
        bind(root / f"{name}.jsonl", run=name)
    (root / "ledger").mkdir()
    replay_stage(root / "ledger", **{n: root / f"{n}.jsonl" for n in ("train_dpdm_eps1", "train_dpdm_eps10")})
    return root / "ledger" / "replay.json"


def test_index_shows_a_passed_replay_with_claims_per_transcript(tmp_path, genuine_report):
    section = verdict_section(render(tmp_path, genuine_report))
    assert "PASSED" in section and "FAILED" not in section
    assert "3 ε claim(s) in 2 ledger transcript(s)" in section
    assert re.search(r"<td>train_dpdm_eps1</td><td>2</td>", section)
    assert re.search(r"<td>train_dpdm_eps10</td><td>1</td>", section)
    assert "dp-accounting" in section  # the versions that recomputed the claims


def test_the_verdict_comes_before_the_headline_rows_and_links_the_report(tmp_path, genuine_report):
    page = render(tmp_path, genuine_report)
    assert page.index("<section id='replay'") < page.index("One row per method")
    assert re.search(r"href='[^']*replay\.json'", verdict_section(page))


def failing_report(genuine_report: Path, tmp_path: Path) -> Path:
    """The genuine report with its second claim understated (as a stale or hand-edited report would be)."""
    report = json.loads(genuine_report.read_text())
    claim = report["claims"][1]
    claim["claimed_epsilon"] = claim["recomputed_epsilon"] / 2
    claim["ok"] = False
    report["all_ok"] = False
    report["transcripts"][0]["ok"] = False
    path = tmp_path / "replay.json"
    write_json(path, report)
    return path


def test_a_failed_replay_is_shown_as_failed_with_the_failing_claim(tmp_path, genuine_report):
    section = verdict_section(render(tmp_path, failing_report(genuine_report, tmp_path)))
    assert "FAILED" in section and "PASSED" not in section
    assert re.search(r"train_dpdm_eps1\.jsonl:2 \(train_dpdm\): claimed ε = [0-9.e+-]+, recomputed certified ε",
                     section)


def test_all_ok_contradicted_by_a_claim_is_not_shown_as_passed(tmp_path, genuine_report):
    report = json.loads(genuine_report.read_text())
    report["claims"][0]["ok"] = False  # all_ok still says true
    verdict = replay_verdict(report)
    assert not verdict.passed and len(verdict.failures) == 1


def test_version_1_reports_are_counted_per_transcript_from_their_claims(genuine_report):
    v2 = json.loads(genuine_report.read_text())
    v1 = copy.deepcopy(v2)
    v1["format"] = "dpgen-replay/1"
    v1["transcripts"] = [t["transcript"] for t in v2["transcripts"]]
    for report in (v1, v2):
        verdict = replay_verdict(report)
        assert verdict.passed
        assert [t.n_claims for t in verdict.transcripts] == [2, 1]


def test_a_page_without_a_replay_report_says_so(tmp_path):
    section = verdict_section(render(tmp_path, None))
    assert "no report given" in section and "PASSED" not in section


def test_a_json_that_is_not_a_replay_report_is_a_one_line_error(tmp_path):
    write_json(tmp_path / "metrics.json", {"fid": 1.0})
    with pytest.raises(PipelineError, match=r"metrics\.json: expected a ledger replay report") as info:
        render(tmp_path, tmp_path / "metrics.json")
    assert "\n" not in str(info.value)
