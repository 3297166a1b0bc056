"""Stages ``audit_mia`` (attack one model), ``audit_mia_table`` (table ``audit_mia``) and ``empden_table13``.

``audit_mia`` scores a trained denoiser's members (a fixed subset of the private training split,
the same subset for every model) against non-members (a held-out real split the models never
trained on, of the same size; DPDM's non-private twin, trained on the first ``n_train`` of those
members only, is scored on exactly those against all the non-members) with the attacks of
:mod:`pipeline.audit.mia`: the loss attack at
each sigma of ``loss_sigmas`` and SecMI's t-error attack at EMPDEN Table 13's stopping points
(t = T, 3T/4, T/2, T/4 of the ``accounting`` grid with asr_N steps, so its numerical column and the
theoretical one are read at the same t). Per attack: AUROC, TPR at 1% and 0.1% FPR (bootstrap
intervals), the best balanced accuracy (ASR), and, for a private model, its certified eps's
bounds: TPR <= e^eps FPR + delta at 1% FPR, ASR <= (e^eps + delta)/(1 + e^eps), and the whole ROC
against the (eps, delta) trade-off curve (:func:`pipeline.audit.mia.curve_excess`). Every row, the
twin's too, gets ``eps_refutable`` (:func:`pipeline.audit.mia.refutable_epsilon`): the attack
refutes every claim eps < eps_refutable at delta = ``eps_refutable_delta`` and the interval's
confidence, and none at or above it; 0 = it refutes nothing. It is the attack's power: a DP
model's claim is refuted iff its certified eps < eps_refutable.

``audit_mia_table`` joins every model's rows and fails the DAG when a private model's ROC lies
above its claim's curve beyond sampling error (the attack would refute the certified eps).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from pipeline import seeds
import pipeline.flow.backbone  # noqa: F401 (registers STRAIGHTDP's flow model kind with the model-file loader)
from pipeline.audit import mia
from pipeline.audit.one_run import attack_curve, tpr_bound
from pipeline.data.members import member_indices
from pipeline.device import resolve_device
from pipeline.diffusion.schedule import EDMSchedule
from pipeline.io import Split, arrays_sha256, load_split, read_json, write_json
from pipeline.models.checkpoint import load_denoiser, read_denoiser_meta
from pipeline.privacy.mia import STOPPING_POINTS, asr_bound, stop_index
from pipeline.reporting.tables import read_table, write_table
from pipeline.stage import PipelineError, stage
from pipeline.training.data import to_model_scale

log = logging.getLogger(__name__)

FPRS = (0.01, 0.001)
FORMAT = "dpgen-mia/2"  # /2: eps_refutable, and a twin's members may be fewer than the non-members

PARAMS_DOC = {
    "mia": "the config's audit.mia section (loss_sigmas, loss_draws, secmi_k, secmi_inversion_steps, bootstrap, "
           "confidence)",
    "grid": "the EDM grid of EMPDEN Table 13 (sigma_min, sigma_max, rho, asr_N of the accounting section)",
    "method": "the method that trained the model (a table column)",
    "run": "the run's name (a table column)",
    "nonmember_split": "the name of the non-member split (a table column)",
    "seed": "the audit's seed (member subset, noise draws, bootstrap)",
    "delta": "the delta at which a non-private model's eps_refutable is read (DPDM's; a private model's is its "
             "own)",
    "device": "auto | cpu | cuda[:N]",
    "threads": "torch CPU threads (default 1)",
}


def _split_tensors(split: Split, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return to_model_scale(split.images).to(device), torch.from_numpy(split.labels.astype(np.int64)).to(device)


def secmi_stops(grid: Mapping[str, Any], k: int) -> dict[str, tuple[float, float]]:
    """Table 13's stopping point label -> (sigma_t, sigma_{t+k}) on the asr_N-step EDM grid.

    sigma_t = t_i with i = :func:`pipeline.privacy.mia.stop_index` (Table 13's theoretical rows use
    the same i); SecMI's forward step goes k grid steps towards noise (Duan et al. 2023 use k = 10
    of T = 1000), stopping at sigma_max.
    """
    times = EDMSchedule(sigma_min=float(grid["sigma_min"]), sigma_max=float(grid["sigma_max"]),
                        rho=float(grid["rho"]), N=int(grid["asr_N"])).times()
    stops = {}
    for label, s in STOPPING_POINTS.items():
        i = stop_index(s, int(grid["asr_N"]))
        stops[label] = (float(times[i]), float(times[max(0, i - k)]))
    return stops


def attack_row(in_scores: np.ndarray, out_scores: np.ndarray, *, epsilon: float | None, delta: float | None,
               confidence: float, bootstrap: int, seed: int, refute_delta: float = 1e-5) -> dict[str, Any]:
    """The statistics of one attack, and its certified eps's bounds when the model is private.

    ``eps_refutable`` (:func:`pipeline.audit.mia.refutable_epsilon`) is read at the model's own delta,
    or at ``refute_delta`` for a non-private model (whose power it measures).
    """
    curve = attack_curve(in_scores, out_scores, fprs=FPRS, n_bootstrap=bootstrap, confidence=confidence, seed=seed)
    rng = np.random.default_rng(seed)
    boot = [mia.attack_accuracy(rng.choice(in_scores, len(in_scores)), rng.choice(out_scores, len(out_scores)))
            for _ in range(bootstrap)]
    alpha = (1 - confidence) / 2
    row: dict[str, Any] = {
        "auc": curve.auc, "auc_low": curve.auc_interval[0], "auc_high": curve.auc_interval[1],
        "asr": mia.attack_accuracy(in_scores, out_scores),
        "asr_low": float(np.quantile(boot, alpha)), "asr_high": float(np.quantile(boot, 1 - alpha)),
        "mean_score_members": float(np.mean(in_scores)), "mean_score_nonmembers": float(np.mean(out_scores))}
    row["eps_refutable_delta"] = float(delta) if epsilon is not None else float(refute_delta)
    row["eps_refutable"] = mia.refutable_epsilon(in_scores, out_scores, delta=row["eps_refutable_delta"],
                                                 confidence=confidence)
    for f, name in zip(FPRS, ("1pct", "0p1pct")):
        row[f"tpr_at_{name}_fpr"] = curve.tpr_at_fpr[f]
        row[f"tpr_at_{name}_fpr_low"], row[f"tpr_at_{name}_fpr_high"] = curve.tpr_interval[f]
    if epsilon is not None:
        check = mia.curve_excess(in_scores, out_scores, epsilon=epsilon, delta=float(delta), confidence=confidence)
        row.update({"tpr_bound_at_1pct_fpr": tpr_bound(epsilon, float(delta), 0.01),
                    "asr_bound": asr_bound(epsilon, float(delta)), "roc_max_excess": check.max_excess,
                    "roc_significant_excess": check.significant_excess, "under_curve": check.under_curve})
    return row


@stage("audit_mia", inputs=("model", "members", "nonmembers"), outputs=("metrics",), params=PARAMS_DOC)
def audit_mia(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Membership inference on one model: loss attack at several sigma, SecMI at Table 13's t."""
    cfg, seed = params["mia"], int(params.get("seed", 0))
    device = resolve_device(str(params.get("device", "auto")))
    if device.type == "cpu":
        torch.set_num_threads(int(params.get("threads", 1)))
    meta = read_denoiser_meta(inputs["model"])
    private = bool(meta.get("private", False))
    epsilon = float(meta["epsilon"]) if private else None
    delta = float(meta["delta"]) if private else None
    if private and not np.isfinite(epsilon):
        raise PipelineError(f"input model {inputs['model']}: a private model's meta must record its certified eps")
    model = load_denoiser(inputs["model"], device).eval()
    denoise = mia.ve_denoiser(model)
    members = load_split(inputs["members"])  # read once: attacked, and hashed against a twin's training subset
    out_x, out_y = _split_tensors(load_split(inputs["nonmembers"]), device)
    all_x, all_y = _split_tensors(members, device)
    if len(all_x) < len(out_x):
        raise PipelineError(f"input members: {len(all_x)} records, fewer than the {len(out_x)} non-members")
    # a twin trained on (a prefix of) the member subset is attacked on exactly its n_train members, against
    # all the non-members: more non-members only sharpen the FPR side; every other model on len(out_x) members
    twin_members = meta.get("members_sha256") is not None
    n_in = int(meta["n_train"]) if twin_members else len(out_x)
    pick = member_indices(len(all_x), n_in, seed).to(device)
    in_x, in_y = all_x[pick], all_y[pick]
    if twin_members:  # the subset attacked must be the one the twin trained on
        ours = arrays_sha256({"images": members.images[pick.cpu().numpy()]})
        if ours != meta["members_sha256"]:
            raise PipelineError(f"input model {inputs['model']}: it trained on another member subset than the one "
                                "attacked here (different audit seed or split sizes); rebuild the twin")

    attacks: list[tuple[dict[str, Any], np.ndarray, np.ndarray]] = []
    draw_seed = seeds.seed_of("audit.mia", seed)  # the same noise draws at every sigma and for every model
    for sigma in cfg["loss_sigmas"]:
        ins, outs = (mia.loss_scores(denoise, x, y, float(sigma), draws=int(cfg["loss_draws"]), seed=draw_seed)
                     for x, y in ((in_x, in_y), (out_x, out_y)))
        attacks.append(({"attack": "loss", "sigma": float(sigma), "stopping_point": None}, ins, outs))
    stops = secmi_stops(params["grid"], int(cfg["secmi_k"]))
    g = params["grid"]
    inversion = EDMSchedule(sigma_min=float(g["sigma_min"]), sigma_max=float(g["sigma_max"]), rho=float(g["rho"]),
                            N=int(cfg["secmi_inversion_steps"])).times()[:-1][::-1].copy()
    secmi_in = mia.secmi_scores(denoise, in_x, in_y, list(stops.values()), inversion_grid=inversion)
    secmi_out = mia.secmi_scores(denoise, out_x, out_y, list(stops.values()), inversion_grid=inversion)
    for (label, (s_t, s_k)), ins, outs in zip(stops.items(), secmi_in, secmi_out):
        attacks.append(({"attack": "secmi", "sigma": s_t, "sigma_t_plus_k": s_k, "stopping_point": label}, ins, outs))

    rows = []
    for j, (what, ins, outs) in enumerate(attacks):
        stats = attack_row(ins, outs, epsilon=epsilon, delta=delta, confidence=float(cfg["confidence"]),
                           bootstrap=int(cfg["bootstrap"]), seed=seed + j,
                           refute_delta=float(params.get("delta", 1e-5)))
        rows.append({**what, **stats, "reference": mia.REFERENCES[what["attack"]]})
        log.info("%s %s sigma %.4g: AUC %.3f [%.3f, %.3f], TPR@1%%FPR %.3f, ASR %.3f, refutes eps < %.3g%s",
                 params.get("run"), what["attack"], what["sigma"], stats["auc"], stats["auc_low"], stats["auc_high"],
                 stats["tpr_at_1pct_fpr"], stats["asr"], stats["eps_refutable"],
                 "" if epsilon is None else f" (eps {epsilon:.3g}: under curve {stats['under_curve']})")
    write_json(outputs["metrics"], {
        "format": FORMAT, "method": params.get("method"), "run": params.get("run"), "private": private,
        "certified_epsilon": epsilon, "delta": delta, "epsilon_source": "the model file's meta (its ledger line's "
        "certified eps)" if private else None, "n_members": len(in_x), "n_nonmembers": len(out_x),
        "nonmember_split": params.get("nonmember_split"), "model_seed": meta.get("seed"),
        "model": str(inputs["model"]), "rows": rows})


TABLE_COLUMNS = [
    "method", "run", "private", "model_seed", "certified_epsilon", "delta", "attack", "sigma", "stopping_point",
    "auc", "auc_low", "auc_high", "tpr_at_1pct_fpr", "tpr_at_1pct_fpr_low", "tpr_at_1pct_fpr_high",
    "tpr_at_0p1pct_fpr", "tpr_at_0p1pct_fpr_low", "tpr_at_0p1pct_fpr_high", "tpr_bound_at_1pct_fpr", "asr",
    "asr_low", "asr_high", "asr_bound", "roc_max_excess", "roc_significant_excess", "under_curve", "eps_refutable",
    "eps_refutable_delta", "n_members", "n_nonmembers", "nonmember_split", "reference"]


def mia_frame(metrics: list[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per (model, attack) from ``audit_mia`` outputs, typed, in :data:`TABLE_COLUMNS` order."""
    rows = []
    for m in metrics:
        if m.get("format") != FORMAT:
            raise PipelineError(f"audit_mia_table: an input is not a {FORMAT} file (format {m.get('format')!r})")
        head = {k: m.get(k) for k in ("method", "run", "private", "model_seed", "certified_epsilon", "delta",
                                      "n_members", "n_nonmembers", "nonmember_split")}
        rows += [{**head, **r} for r in m["rows"]]
    df = pd.DataFrame(rows).reindex(columns=TABLE_COLUMNS)
    floats = [c for c in TABLE_COLUMNS if c not in ("method", "run", "private", "attack", "stopping_point",
                                                     "under_curve", "nonmember_split", "reference", "n_members",
                                                     "n_nonmembers", "model_seed")]
    return df.astype({c: "float64" for c in floats} | {"private": "bool", "under_curve": "boolean",
                                                        "n_members": "int64", "n_nonmembers": "int64",
                                                        "model_seed": "Int64"})


@stage("audit_mia_table", outputs=("table",), any_inputs=True,
       params={"config_id": "id of the configuration", "seed": "the audit's seed"})
def audit_mia_table(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Table ``audit_mia``: every attacked model's attacks; fails if one refutes a certified eps."""
    df = mia_frame([read_json(p) for _, p in sorted(inputs.items())])
    refuted = df[df["private"] & (df["under_curve"] == False)]  # noqa: E712 (a nullable boolean column)
    if len(refuted):
        worst = refuted.sort_values("roc_significant_excess").iloc[-1]
        raise PipelineError(
            f"stage audit_mia_table: a membership attack refutes a certified eps: {worst['method']} {worst['run']} "
            f"({worst['attack']} at sigma {worst['sigma']:.4g}) lies {worst['roc_significant_excess']:.3g} above the "
            f"eps = {worst['certified_epsilon']:.4g} trade-off curve beyond sampling error ({len(refuted)} such rows)")
    write_table(df, outputs["table"], config_id=str(params.get("config_id", "unknown")),
                seed=int(params.get("seed", 0)))


@stage("empden_table13", inputs=("theoretical", "twin"), outputs=("table",),
       params={"config_id": "id of the configuration", "seed": "the audit's seed"})
def empden_table13(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """EMPDEN Table 13: the theoretical ASR bound per (q, t) beside SecMI's measured ASR on the non-private
    twin (a neural denoiser trained on all private records, stopped at the same t; App. L)."""
    theory = read_table(inputs["theoretical"])
    twin = read_json(inputs["twin"])
    secmi = pd.DataFrame([r for r in twin["rows"] if r["attack"] == "secmi"])
    if secmi.empty:
        raise PipelineError(f"input twin {inputs['twin']}: no SecMI rows")
    numerical = secmi.set_index("stopping_point")
    missing = sorted(set(theory["stopping_point"]) - set(numerical.index))
    if missing:
        raise PipelineError(f"input twin: no SecMI row at stopping point(s) {', '.join(missing)}")
    t = theory.copy()
    for col, src in (("numerical_asr", "asr"), ("numerical_asr_low", "asr_low"), ("numerical_asr_high", "asr_high"),
                     ("numerical_auc", "auc"), ("numerical_sigma_t", "sigma")):
        t[col] = t["stopping_point"].map(numerical[src]).astype("float64")
    far = (t["numerical_sigma_t"] - t["t_stop"]).abs() > 1e-9 * t["t_stop"]
    if far.any():
        raise PipelineError("empden_table13: the twin's SecMI stops are not Table 13's t (audit grid differs from "
                            "the accounting section's)")
    t["numerical_attack"] = "SecMI_stat (Duan et al. 2023) on the non-private DPDM twin " + str(twin["run"])
    t["numerical_n_members"], t["numerical_n_nonmembers"] = twin["n_members"], twin["n_nonmembers"]
    write_table(t, outputs["table"], config_id=str(params.get("config_id", "unknown")),
                seed=int(params.get("seed", 0)))
