"""audit_mia -> audit_mia_table -> empden_table13 on tiny models: every column present and typed, a
private model's bounds beside its attack, a refuted claim fails the DAG in one line, and Table 13's
numerical column is read at the theoretical rows' own t."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.audit.mia_stage import TABLE_COLUMNS, audit_mia, audit_mia_table, empden_table13, secmi_stops
from pipeline.config import schema_defaults
from pipeline.io import Split, save_split
from pipeline.privacy.mia import STOPPING_POINTS
from pipeline.reporting.tables import read_table
from pipeline.methods.accounting.blocks import empden_table13_theoretical_asr
from pipeline.stage import PipelineError
from pipeline.training.dp_denoiser import train_dp_denoiser
from pipeline.methods.audit.twin import train_dpdm_twin

from tests.training.test_dp_denoiser import TINY_UNET

GRID = {"sigma_min": 0.002, "sigma_max": 80.0, "rho": 7.0, "asr_N": 40}
MIA = {**schema_defaults("audit", "mia"), "loss_sigmas": [0.5, 2.0], "loss_draws": 2, "secmi_k": 2,
       "secmi_inversion_steps": 6, "bootstrap": 20}
TRAIN = {"batch_size": 8, "steps": 2, "lr": 3e-4, "K": 1, "unet": TINY_UNET, "device": "cpu", "seed": 3,
         "config_id": "test"}


def split(path, n, seed):
    rng = np.random.default_rng(seed)
    save_split(path, Split(rng.integers(0, 256, (n, 1, 8, 8), dtype=np.uint8), np.arange(n) % 3),
               name=path.stem, source="test", seed=seed)
    return path


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mia")
    members, nonmembers = split(tmp / "private_train.npz", 40, 0), split(tmp / "reference.npz", 16, 1)
    train_dpdm_twin({"data": members}, {"model": tmp / "twin.pt", "metrics": tmp / "twin.json"}, TRAIN)
    train_dp_denoiser({"data": members}, {"model": tmp / "dp.pt", "ledger": tmp / "dp.jsonl", "metrics": tmp / "dp_m.json"},
               {**TRAIN, "epsilon": 1.0, "micro_batch": 4, "ledger_binding": {"run": "r", "experiment": "exp"},
                "private": {"N": 40, "n_classes": 3}})
    out = {}
    for name, model in (("twin", tmp / "twin.pt"), ("dp", tmp / "dp.pt")):
        out[name] = tmp / f"{name}_mia.json"
        audit_mia({"model": model, "members": members, "nonmembers": nonmembers}, {"metrics": out[name]},
                  {"mia": MIA, "grid": GRID, "method": "dpdm_twin" if name == "twin" else "dpdm", "run": name,
                   "nonmember_split": "reference", "seed": 0, "device": "cpu"})
    return tmp, out


def test_each_model_gets_every_attack_and_a_private_one_its_bounds(attacked):
    _, out = attacked
    twin, dp = (json.loads(out[k].read_text()) for k in ("twin", "dp"))
    assert twin["private"] is False and twin["certified_epsilon"] is None
    assert dp["private"] is True and 0 < dp["certified_epsilon"] <= 1.0
    for m in (twin, dp):
        assert [(r["attack"], r["stopping_point"]) for r in m["rows"]] == \
            [("loss", None), ("loss", None)] + [("secmi", s) for s in STOPPING_POINTS]
        assert m["n_members"] == m["n_nonmembers"] == 16
        for r in m["rows"]:
            assert 0 <= r["auc_low"] <= r["auc"] <= r["auc_high"] <= 1
            assert 0.5 <= r["asr"] <= 1
    assert all("asr_bound" not in r for r in twin["rows"])
    for r in dp["rows"]:
        assert r["asr_bound"] == pytest.approx((np.exp(dp["certified_epsilon"]) + dp["delta"])
                                               / (1 + np.exp(dp["certified_epsilon"])))
        assert r["tpr_bound_at_1pct_fpr"] == pytest.approx(np.exp(dp["certified_epsilon"]) * 0.01 + dp["delta"])


def test_the_table_has_every_column_typed(attacked):
    tmp, out = attacked
    audit_mia_table(out, {"table": tmp / "audit_mia.parquet"}, {"seed": 0})
    df = read_table(tmp / "audit_mia.parquet")
    assert list(df.columns)[:len(TABLE_COLUMNS)] == TABLE_COLUMNS and len(df) == 12
    assert df["auc"].dtype == "float64" and df["private"].dtype == bool
    assert df.loc[df["private"], "certified_epsilon"].notna().all()
    assert df.loc[~df["private"], "under_curve"].isna().all()


def test_an_attack_that_refutes_a_claim_fails_the_table_in_one_line(attacked, tmp_path):
    _, out = attacked
    forged = json.loads(out["dp"].read_text())
    forged["rows"][0].update(under_curve=False, roc_significant_excess=0.2)
    (tmp_path / "forged.json").write_text(json.dumps(forged))
    with pytest.raises(PipelineError, match=r"refutes a certified eps: dpdm dp \(loss at sigma 0.5\)"):
        audit_mia_table({"dp": tmp_path / "forged.json"}, {"table": tmp_path / "t.parquet"}, {})


def test_table13_gets_secmi_on_the_twin_at_the_theoretical_rows_t(attacked):
    tmp, out = attacked
    accounting = {**schema_defaults("accounting"), **{k: GRID[k] for k in ("sigma_min", "sigma_max", "rho")},
                  "asr_N": GRID["asr_N"], "asr_q": [0.5]}
    empden_table13_theoretical_asr({}, {"table": tmp / "theory.parquet"}, {"accounting": accounting, "n": 1000})
    empden_table13({"theoretical": tmp / "theory.parquet", "twin": out["twin"]}, {"table": tmp / "t13.parquet"}, {})
    t13 = read_table(tmp / "t13.parquet")
    assert list(t13["stopping_point"]) == list(STOPPING_POINTS)
    np.testing.assert_allclose(t13["numerical_sigma_t"], t13["t_stop"], rtol=1e-9)
    assert t13["numerical_asr"].between(0.5, 1).all() and t13["asr_upper_bound"].notna().all()
    stops = secmi_stops(GRID, MIA["secmi_k"])
    assert [s_t for s_t, _ in stops.values()] == pytest.approx(list(t13["t_stop"]))
    assert all(s_t < s_k for s_t, s_k in stops.values())


def test_a_twin_trained_on_another_member_subset_is_refused(attacked, tmp_path):
    tmp, _ = attacked
    members, nonmembers = tmp / "private_train.npz", tmp / "reference.npz"
    train_dpdm_twin({"data": members, "nonmembers": nonmembers}, {"model": tmp_path / "t.pt", "metrics": tmp_path / "t.json"},
                    {**TRAIN, "member_seed": 5})
    params = {"mia": MIA, "grid": GRID, "method": "dpdm_twin", "run": "t", "device": "cpu"}
    audit_mia({"model": tmp_path / "t.pt", "members": members, "nonmembers": nonmembers},
              {"metrics": tmp_path / "ok.json"}, {**params, "seed": 5})
    with pytest.raises(PipelineError, match="another member subset"):
        audit_mia({"model": tmp_path / "t.pt", "members": members, "nonmembers": nonmembers},
                  {"metrics": tmp_path / "bad.json"}, {**params, "seed": 6})


@pytest.mark.slow  # a fresh Python process (torch imported anew): the slow tier
def test_a_flow_model_file_is_attacked_from_a_fresh_process(attacked, tmp_path):
    """STRAIGHTDP's flows go through the same attacks (the CLI must know the flow model kind by itself)."""
    import subprocess
    import sys

    import torch

    from pipeline.flow.backbone import FLOW_PRECOND, FlowSpec, build_flow_model
    from pipeline.models.checkpoint import save_denoiser

    tmp, _ = attacked
    spec = FlowSpec(image_size=8, channels=1, patch_size=2, num_layers=1, attention_head_dim=8, num_attention_heads=2,
                    joint_attention_dim=8, caption_projection_dim=16, pooled_projection_dim=8, pos_embed_max_size=4,
                    num_classes=3)
    torch.manual_seed(0)
    save_denoiser(tmp_path / "flow.pt", build_flow_model(spec), backbone=spec, precond=FLOW_PRECOND,
                  meta={"private": True, "epsilon": 1.0, "delta": 1e-5, "seed": 0})
    params = {"mia": MIA, "grid": GRID, "method": "straightdp", "run": "flow", "seed": 0, "device": "cpu"}
    res = subprocess.run([sys.executable, "-m", "pipeline", "audit_mia", "--in", f"model={tmp_path / 'flow.pt'}",
                          f"members={tmp / 'private_train.npz'}", f"nonmembers={tmp / 'reference.npz'}", "--out",
                          f"metrics={tmp_path / 'flow.json'}", "--params", json.dumps(params)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads((tmp_path / "flow.json").read_text())["rows"]
    assert len(rows) == 6 and all(r["under_curve"] for r in rows)


def test_every_row_gets_eps_refutable_and_a_private_verdict_agrees_with_it(attacked):
    """eps_refutable is the ROC check inverted: a private row is under its curve iff its certified eps is not below
    the attack's eps_refutable; the twin's is read at the params' delta (no delta of its own)."""
    tmp, out = attacked
    audit_mia_table(out, {"table": tmp / "audit_mia.parquet"}, {"seed": 0})
    df = read_table(tmp / "audit_mia.parquet")
    assert df["eps_refutable"].dtype == "float64" and (df["eps_refutable"] >= 0).all()
    dp = df[df["private"]]
    assert (dp["under_curve"] == (dp["certified_epsilon"] >= dp["eps_refutable"])).all()
    assert (dp["eps_refutable_delta"] == dp["delta"]).all()
    assert (df.loc[~df["private"], "eps_refutable_delta"] == 1e-5).all()  # the stage's default: DPDM's delta


def test_a_twin_on_fewer_members_is_attacked_on_exactly_them_against_every_non_member(attacked, tmp_path):
    tmp, _ = attacked
    members, nonmembers = tmp / "private_train.npz", tmp / "reference.npz"
    train_dpdm_twin({"data": members, "nonmembers": nonmembers},
                    {"model": tmp_path / "t.pt", "metrics": tmp_path / "t.json"}, {**TRAIN, "member_seed": 0,
                                                                                   "members": 6})
    audit_mia({"model": tmp_path / "t.pt", "members": members, "nonmembers": nonmembers},
              {"metrics": tmp_path / "t_mia.json"},
              {"mia": MIA, "grid": GRID, "method": "dpdm_twin", "run": "t", "device": "cpu", "seed": 0, "delta": 1e-3})
    m = json.loads((tmp_path / "t_mia.json").read_text())
    assert (m["n_members"], m["n_nonmembers"]) == (6, 16)
    assert all(r["eps_refutable_delta"] == 1e-3 and r["eps_refutable"] >= 0 for r in m["rows"])
