"""The method registry (pipeline.registry): what a method's rule file registers reaches rule all,
the index page and the replay when, and only when, the config's `methods` chooses the method."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.registry import MethodRegistry, RunRecord, TranscriptSpec

SPEC = TranscriptSpec(claims=2, run="alpha_run", stage="train_alpha", delta=1e-5, data="d/private_train.npz",
                      params={"count": 1})


def registry() -> MethodRegistry:
    reg = MethodRegistry()
    reg.register_targets("alpha", lambda: ["t/alpha_table.parquet", "f/alpha_fig.png", "x/alpha_extra.json"])
    reg.register_transcripts("alpha", lambda: {"l/alpha_run.jsonl": SPEC})
    reg.register_targets("beta", lambda: ["t/beta_table.parquet"])
    return reg


def test_a_registered_method_reaches_rule_all_the_index_and_the_replay():
    reg = registry()
    assert reg.targets(["alpha", "beta"]) == [Path("t/alpha_table.parquet"), Path("f/alpha_fig.png"),
                                              Path("x/alpha_extra.json"), Path("t/beta_table.parquet")]
    # the index shows tables and figures only
    assert reg.report_targets(["alpha"]) == [Path("t/alpha_table.parquet"), Path("f/alpha_fig.png")]
    assert reg.transcripts(["alpha", "beta"]) == {Path("l/alpha_run.jsonl"): SPEC}


def test_the_methods_list_chooses_and_orders():
    reg = registry()
    assert reg.targets(["beta"]) == [Path("t/beta_table.parquet")]
    assert reg.targets(["beta", "alpha"])[0] == Path("t/beta_table.parquet")
    assert reg.targets([]) == [] and reg.transcripts(["beta"]) == {}


def test_a_method_left_out_never_computes_its_targets():
    reg = MethodRegistry()

    def broken():
        raise AssertionError("computed although not chosen")

    reg.register_targets("off", broken)
    reg.register_transcripts("off", broken)
    assert reg.targets([]) == [] and reg.transcripts([]) == {}


def test_a_chosen_method_no_rule_file_registers_is_a_one_line_error():
    with pytest.raises(ValueError, match="config error at methods: gamma has no rule file registering it"):
        registry().targets(["alpha", "gamma"])


def test_runs_of_the_chosen_methods_in_order_each_metrics_file_once():
    reg = MethodRegistry()
    a = RunRecord(method="alpha", config="a1", seed=0, metrics="e/a1.json", ledgers=("l/a1.jsonl",))
    shared = RunRecord(method="beta", config="b1", seed=0, metrics="e/b1.json", private=False)
    reg.register_runs("alpha", lambda: [a])
    reg.register_runs("beta", lambda: [shared, shared])
    assert reg.runs(["beta", "alpha"]) == [shared, a]
    assert reg.runs(["alpha"]) == [a]


def test_a_private_run_record_needs_its_transcripts():
    with pytest.raises(ValueError, match="needs its ledger transcripts"):
        RunRecord(method="alpha", config="a1", seed=0, metrics="e/a1.json")


def test_a_transcript_is_registered_with_what_the_replay_binds_it_to():
    """Issue #35: a bare claim count cannot bind a transcript to its run, stage, delta and private split."""
    reg = MethodRegistry()
    reg.register_transcripts("alpha", lambda: {"l/a.jsonl": 2})
    with pytest.raises(TypeError, match=r"method alpha: transcript l/a.jsonl is registered with 2; register a "
                                        r"TranscriptSpec"):
        reg.transcripts(["alpha"])
    # one configured mapping and target for every line, as JSON the rule replay passes
    assert SPEC.as_dict() == {"claims": 2, "run": "alpha_run", "stage": "train_alpha", "delta": 1e-5,
                              "data": "d/private_train.npz", "configuration": False,
                              "params": [{"count": 1}, {"count": 1}], "epsilon_target": [None, None], "after": [],
                              "rtol": 1e-3, "phase": "", "prior_lines": [[], []]}
    per_line = TranscriptSpec(**{**SPEC.as_dict(), "params": [{"count": 1}, {"count": 2}], "epsilon_target": 1,
                                 "after": ["l/a.jsonl"]})
    assert per_line.params == ({"count": 1}, {"count": 2}) and per_line.epsilon_target == (1.0, 1.0)
    assert per_line.after == ("l/a.jsonl",)


@pytest.mark.parametrize("kwargs, message", [({"claims": 0}, "claims must be an integer >= 1"),
                                             ({"data": None}, "names the private split it read"),
                                             ({"configuration": True}, "configuration claims read none"),
                                             ({"params": ()}, "params must be one value for every line or one per"),
                                             ({"params": [{"count": 1}]}, r"one per line \(2\)"),
                                             ({"params": {}}, "every line needs its configured mechanism "),
                                             ({"epsilon_target": 0}, "epsilon_target must be > 0 or None"),
                                             ({"epsilon_target": [1.0]}, "epsilon_target must be one value"),
                                             ({"rtol": 0.5}, r"rtol must be in \(0, 0.5\)"),
                                             ({"prior_lines": [[], [1]]}, "prior_lines must list, for each"),
                                             ({"prior_lines": [[]]}, "prior_lines must list, for each")])
def test_a_bad_transcript_spec_is_a_one_line_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TranscriptSpec(**{**SPEC.as_dict(), **kwargs})


def test_two_transcripts_of_one_identity_are_refused_until_each_release_names_its_phase():
    reg = MethodRegistry()
    twice = {"l/phase1.jsonl": SPEC, "l/phase2.jsonl": SPEC}
    reg.register_transcripts("alpha", lambda: twice)
    with pytest.raises(ValueError, match=r"l/phase1.jsonl and l/phase2.jsonl are both registered as run 'alpha_run', "
                                         r"stage 'train_alpha', phase ''"):
        reg.transcripts(["alpha"])
    phased = MethodRegistry()
    phased.register_transcripts("alpha", lambda: {p: TranscriptSpec(**{**SPEC.as_dict(), "phase": p[2:8]})
                                                  for p in twice})
    assert [s.phase for s in phased.transcripts(["alpha"]).values()] == ["phase1", "phase2"]


def test_a_methods_bundles_are_listed_without_reading_them_and_each_read_when_asked():
    from pipeline.registry import BundleSpec

    reg, read = registry(), []

    def bundle(run: str) -> BundleSpec:
        read.append(run)
        return BundleSpec(run=run, samples="s.npz", metrics="m.json", transcripts=("l/alpha_run.jsonl",))

    reg.register_bundles("alpha", lambda: ["r1", "r2", "r1"], bundle)
    assert reg.bundle_runs(["alpha", "beta"]) == [("alpha", "r1"), ("alpha", "r2")] and read == []
    assert reg.bundle("alpha", "r2").kind == "synthetic" and read == ["r2"]
    assert reg.bundle_runs(["beta"]) == []
    with pytest.raises(KeyError, match="registers no bundles"):
        reg.bundle("beta", "r1")


@pytest.mark.parametrize("fields, match", [
    ({"transcripts": ()}, "needs its ledger transcripts"),
    ({"model": "m.pt"}, "says how it samples"),
    ({"sampling": {"sampler": "dpdm"}}, "says how it samples"),
    ({"run": "a/b"}, "one folder"),
])
def test_a_bundle_without_its_claim_or_with_half_a_model_is_refused(fields, match):
    from pipeline.registry import BundleSpec

    with pytest.raises(ValueError, match=match):
        BundleSpec(**{"run": "r", "samples": "s.npz", "metrics": "m.json", "transcripts": ("l.jsonl",), **fields})


class _Full:
    """A wiring with every capability (the shape of pipeline/methods/dpdm/wiring.py's)."""

    def targets(self):
        return ["t/full_table.parquet"]

    def resources(self, rule):
        return {"mem_mb": 100, "runtime": 1}

    def transcripts(self):
        return {"l/full_run.jsonl": SPEC}

    def records(self):
        return [RunRecord(method="full", config="c", seed=0, metrics="m/full.json", ledgers=("l/full_run.jsonl",))]

    def bundle_runs(self):
        return ["r1"]

    def bundle(self, run):
        return f"bundle of {run}"


class _TargetsOnly:
    def targets(self):
        return ["t/only_table.parquet"]

    def resources(self, rule):
        return {}


def test_one_register_call_registers_whatever_the_wiring_gives():
    reg = MethodRegistry()
    reg.register(_Full(), method="full")
    reg.register(_TargetsOnly(), method="only")
    assert reg.methods == ["full", "only"]
    assert reg.targets(["full", "only"]) == [Path("t/full_table.parquet"), Path("t/only_table.parquet")]
    assert reg.transcripts(["full", "only"]) == {Path("l/full_run.jsonl"): SPEC}
    assert [r.metrics for r in reg.runs(["full", "only"])] == ["m/full.json"]
    assert reg.bundle_runs(["full", "only"]) == [("full", "r1")] and reg.bundle("full", "r1") == "bundle of r1"


def test_a_wiring_is_named_by_its_method_package_and_anything_else_is_refused(tmp_path):
    from pipeline.methods.sensgeo.wiring import Wiring
    from pipeline.registry import method_of

    from tests.methods import house

    assert method_of(Wiring(house(tmp_path))) == "sensgeo"
    reg = MethodRegistry()
    reg.register(Wiring(house(tmp_path)))
    assert reg.methods == ["sensgeo"]
    with pytest.raises(TypeError, match="is no method's wiring"):
        reg.register(_TargetsOnly())  # defined in the tests, not in pipeline/methods/<method>/wiring.py
    with pytest.raises(TypeError, match="needs targets"):
        reg.register(object(), method="x")  # type: ignore[arg-type]
    half = type("Half", (_TargetsOnly,), {"bundle_runs": lambda self: []})
    with pytest.raises(TypeError, match="both bundle_runs"):
        reg.register(half(), method="half")
