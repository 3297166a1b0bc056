"""The audits' wiring (pipeline/methods/audit/wiring.py): which transcripts the one-run audit reads, which models the
membership attacks score, DPDM's non-private twin, the targets per chosen methods."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import pipeline.resources as cost
from pipeline.plugins import audited_methods
from pipeline.methods.audit import costs
from pipeline.methods.audit.wiring import MIA_GRID_KEYS, MIA_NONMEMBERS, Wiring
from pipeline.registry import MethodRegistry, TranscriptSpec
from tests.methods import check_requests, house


def registry(tmp_path: Path) -> MethodRegistry:
    """Every method registers one transcript of ``claims`` = 1 + its index here: the audit's sums tell whose it read."""
    reg = MethodRegistry()
    for i, m in enumerate(["accounting", "baselines", "dpdm", "empden", "straightdp"]):
        spec = TranscriptSpec(claims=1 + i, run=m, stage=m, delta=1e-5, data=tmp_path / "private_train.npz",
                              params={"count": 1})
        reg.register_transcripts(m, lambda p=tmp_path / f"{m}.jsonl", s=spec: {p: s})
        reg.register_targets(m, lambda: [])
    return reg


def audit(tmp_path: Path, edit=None) -> Wiring:
    return Wiring(house(tmp_path, edit), registry(tmp_path).transcripts)


def methods(*chosen):
    def edit(cfg):
        cfg["methods"] = list(chosen)
    return edit


@pytest.fixture
def exp(tmp_path) -> Path:
    return tmp_path / "r" / "digits"


# ---------------------------------------------------------------------------------------------- the one-run audit


def test_the_one_run_audit_reads_the_transcripts_of_the_chosen_audited_methods_only(tmp_path):
    a = audit(tmp_path)
    assert a.audited_methods == ["baselines", "dpdm", "empden", "straightdp"] == audited_methods()
    # accounting's configuration claims are not a mechanism run: never audited
    assert a.audited_transcripts() == {m: tmp_path / f"{m}.jsonl" for m in ("baselines", "dpdm", "empden", "straightdp")}
    some = audit(tmp_path, methods("accounting", "dpdm", "audit"))
    assert some.audited_methods == ["dpdm"] and list(some.audited_claims()) == [tmp_path / "dpdm.jsonl"]
    assert some.empden_claims() == {}
    assert list(a.empden_claims()) == [tmp_path / "empden.jsonl"]


def test_the_audit_jobs_minutes_are_costed_from_the_claims_it_reruns_and_empdens_apart(tmp_path):
    """claims: baselines 2, dpdm 3, empden 4, straightdp 5 (registry above); accounting's 1 is never audited."""
    a = audit(tmp_path)
    assert a.one_run_runtime_min() == costs.one_run_runtime_min(a.house.config, 2 + 3 + 4 + 5, 4)
    b = audit(tmp_path, methods("accounting", "dpdm", "straightdp", "audit"))
    assert b.one_run_runtime_min() == costs.one_run_runtime_min(b.house.config, 3 + 5, 0)
    # the job asks for it when Snakemake builds the DAG (every rule file read, every transcript registered)
    assert a.resources("audit_one_run")["runtime"](SimpleNamespace()) == a.one_run_runtime_min()


def test_every_rule_asks_for_its_request_in_the_audits_cost_model(tmp_path):
    a = audit(tmp_path)
    requests = check_requests(a, "audit.smk", costs.REQUESTS)
    cfg = a.house.config
    assert requests["audit_mia"]["runtime"] == costs.mia_runtime_min(cfg) > 0
    # the twin is resumable: its request within the time limit, its retries from the whole prediction
    assert a.twin_runtime_min == costs.twin_runtime_min(cfg) > 0
    assert requests["train_dpdm_twin"]["runtime"] == cost.segment_runtime_min(cfg, a.twin_runtime_min)


def test_the_one_run_params_are_the_audit_section_seed_and_threads(tmp_path):
    a = audit(tmp_path)
    p = json.loads(a.one_run_params())
    assert p["audit"] == a.section == a.house.config["audit"]
    assert (p["seed"], p["threads"]) == (0, a.house.torch_threads) and "config_id" in p


# ---------------------------------------------------------------------------------------------- membership inference


def test_the_attacks_score_dpdms_main_runs_a_twin_per_seed_and_straightdps_trained_flows(tmp_path):
    models = audit(tmp_path).mia_models()
    assert models[:4] == [("dpdm", "edm_eps0p2_K1_seed0"), ("dpdm", "edm_eps1_K1_seed0"),
                          ("dpdm", "edm_eps10_K1_seed0"), ("dpdm_twin", "twin_seed0")]
    flows = [run for method, run in models if method == "straightdp"]
    # Table 1's rows that train a flow with a plan; released_only (Stage 1 only) trains none
    assert flows == ["uniform_eps1_seed0", "uniform_moments_eps1_seed0", "tha_moments_eps1_seed0",
                     "lora_moments_eps1_seed0"]
    assert audit(tmp_path, methods("dpdm", "audit")).mia_models() == models[:4]
    assert audit(tmp_path, methods("empden", "audit")).mia_models() == []


def test_each_attacked_model_is_read_from_its_methods_model_file(tmp_path, exp):
    a = audit(tmp_path)
    m = lambda method, run: a.mia_model_input(SimpleNamespace(method=method, run=run))  # noqa: E731
    assert m("dpdm", "edm_eps1_K1_seed0") == exp / "models" / "dpdm" / "edm_eps1_K1_seed0.pt"
    assert m("straightdp", "uniform_eps1_seed0") == exp / "models" / "straightdp" / "uniform_eps1_seed0.pt"
    assert m("dpdm_twin", "twin_seed3") == exp / "models" / "dpdm" / "twin_seed3.pt" == a.twin_model_path(3)
    with pytest.raises(ValueError, match="twin_seed<seed>, got 'twin3'"):
        m("dpdm_twin", "twin3")


def test_the_attack_table_reads_every_models_metrics_and_table13_the_first_seeds_twin(tmp_path, exp):
    a = audit(tmp_path)
    ins = a.mia_table_inputs()
    assert len(ins) == len(a.mia_models())
    assert ins["dpdm_twin__twin_seed0"] == exp / "audit" / "mia" / "dpdm_twin" / "twin_seed0.json"
    assert a.mia_metrics_path("{method}", "{run}") == exp / "audit" / "mia" / "{method}" / "{run}.json"
    assert a.table13_twin == a.mia_metrics_path("dpdm_twin", "twin_seed0")
    assert json.loads(a.table_params())["seed"] == 0


def test_an_attacks_params_leave_the_twins_keys_out_and_read_eps_refutable_at_dpdms_delta(tmp_path):
    a = audit(tmp_path)
    p = json.loads(a.mia_params(SimpleNamespace(method="dpdm", run="edm_eps1_K1_seed0")))
    assert p["mia"] == a.mia_attack_settings() and not any(k.startswith("twin_") for k in p["mia"])
    assert p["grid"] == {k: a.house.config["accounting"][k] for k in MIA_GRID_KEYS}
    assert (p["method"], p["run"], p["nonmember_split"], p["delta"]) == ("dpdm", "edm_eps1_K1_seed0",
                                                                         MIA_NONMEMBERS, 1e-5)
    assert a.nonmembers == a.house.layout.split("reference")

    def longer_twin(cfg):
        cfg["audit"]["mia"]["twin_epochs"] = 900
    assert audit(tmp_path, longer_twin).mia_params(SimpleNamespace(method="dpdm", run="x")) == \
        a.mia_params(SimpleNamespace(method="dpdm", run="x"))
    assert a.resources("audit_mia")["runtime"] > 0 and a.twin_runtime_min > 0


# ---------------------------------------------------------------------------------------------- the twin


def test_the_twin_trains_dpdms_recipe_without_the_mechanism_on_the_attacked_members(tmp_path, exp):
    a = audit(tmp_path)
    assert a.twin_inputs(SimpleNamespace(seed="0")) == {"data": exp / "data" / "private_train.npz",
                                                        "init": exp / "models" / "public_edm.pt",
                                                        "nonmembers": exp / "data" / "reference.npz"}
    p = json.loads(a.twin_params(SimpleNamespace(seed="2")))
    assert (p["epochs"], p["K"], p["members"], p["seed"], p["member_seed"]) == (500, 1, 100, 2, 0)
    assert p["parameterisation"] == "edm" and p["lr"] == a.dpdm.section["lr"]
    # no mechanism: neither a clip, a delta nor an eps reaches it
    assert not {"clip", "delta", "epsilon", "ledger_binding"} & set(p)
    assert a.twin_metrics(2) == exp / "train" / "dpdm_twin" / "twin_seed2.json"

    def on_private_train(cfg):
        cfg["audit"]["mia"]["twin_train_on"] = "private_train"
        cfg["dpdm"]["init"] = "scratch"
    b = audit(tmp_path, on_private_train)
    assert b.twin_inputs(SimpleNamespace(seed="0")) == {"data": exp / "data" / "private_train.npz"}
    assert "members" not in json.loads(b.twin_params(SimpleNamespace(seed="0")))


# ---------------------------------------------------------------------------------------------- targets


def test_the_targets_follow_the_chosen_methods(tmp_path):
    tables = tmp_path / "r" / "tables"
    a = audit(tmp_path)
    assert a.targets() == [tables / "audit_one_run.parquet", tables / "audit_mia.parquet",
                           tables / "empden_table13.parquet"]
    assert a.table == tables / "audit_one_run.parquet" and a.mia_table == tables / "audit_mia.parquet"
    assert a.table13 == tables / "empden_table13.parquet"
    assert audit(tmp_path, methods("dpdm", "audit")).mia_targets() == [a.mia_table]  # Table 13 needs accounting
    assert audit(tmp_path, methods("empden", "audit")).targets() == [a.table]
    assert a.all_runs_inputs() == {"audit_one_run": a.table, "audit_mia": a.mia_table}
    assert audit(tmp_path, methods("empden", "audit")).all_runs_inputs() == {"audit_one_run": a.table}
    assert audit(tmp_path, methods("dpdm")).all_runs_inputs() == {}
    assert a.chosen == a.house.config["methods"]
