"""STRAIGHTDP Figure 6 (the 2-D mixture control): stage ``straightdp_figure6_toy``.

Runs every point of the figure (``straightdp.toy.seeds`` x ``straightdp.toy.epsilons`` x the rows of
:data:`pipeline.methods.straightdp.toy.ROWS`, in :func:`pipeline.methods.straightdp.runs.toy_points`' order, plus the
public-only reference per seed) in one process -- each point is seconds of CPU on a 2-D MLP, so one job per
point would be mostly start-up -- and writes:

* ``table`` (``straightdp_figure6_toy.parquet``): one row per point: ``row``, ``label``,
  ``eps_target``, ``seed``, ``eps_certified`` (recomputed from the point's ledger lines by the
  replay's accountant, composed for StraightDP; NaN for the reference), ``delta``, ``w2``,
  ``n_eval``, ``tau``, ``wall_s``;
* ``figure`` (PNG + PDF): W2 vs certified eps per line, +-1 s.d. over seeds, log eps axis, the
  public-only reference as a horizontal line;
* ``ledger``: every mechanism's line (the replay audits it with the other transcripts).

Paper reading (Fig. 6): "Both plans improve with budget and remain within seed noise of each other
at this scale: the toy control verifies the pipeline end-to-end, but the problem is too small to
separate the training plans".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.methods.straightdp import toy
from pipeline.methods.straightdp.stages import section
from pipeline.io import atomic_path, load_points
from pipeline.privacy import ledger
from pipeline.privacy.certify import composed_entry, recompute_cached
from pipeline.reporting import save_figure
from pipeline.reporting.figures import readable_log_axis
from pipeline.reporting.tables import write_table
from pipeline.stage import PipelineError, stage
from pipeline.training.data import manifest_sha256
from pipeline.methods.straightdp.runs import toy_points

import matplotlib.pyplot as plt  # noqa: E402  (pipeline.reporting selected the Agg backend)

log = logging.getLogger(__name__)

TOY_DATA_KEYS = ("n", "n_modes", "radius", "std")


@stage("straightdp_figure6_toy", inputs=("toy",), outputs=("table", "figure", "ledger"),
       params={"straightdp": "the config's straightdp section (its toy subsection lists the points)",
               "toy_data": "the config's data.toy section (n, the declared size; n_modes, radius, std of the "
                            "true mixture)",
               "config_id": "id of the configuration (table rows and ledger lines)",
               "threads": "torch CPU threads (default 1)", ledger.BINDING_PARAM: ledger.BINDING_DOC})
def straightdp_figure6_toy(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """STRAIGHTDP Figure 6: W2 to the true 2-D mixture vs eps for moments only, uniform DP-SGD and
    StraightDP, every mechanism on the ledger (module doc)."""
    import torch

    torch.set_num_threads(int(params.get("threads", 1)))
    cfg = section(params)
    toy_data = params.get("toy_data") or {}
    missing = [k for k in TOY_DATA_KEYS if k not in toy_data]
    if missing:
        raise PipelineError(f"stage straightdp_figure6_toy: param toy_data.{missing[0]} is required "
                            f"(the data.toy section: {', '.join(TOY_DATA_KEYS)})")
    points, labels = load_points(inputs["toy"])
    binding = ledger.binding_of(params, data_sha256=manifest_sha256(inputs["toy"], "toy"),
                                stage="straightdp_figure6_toy")
    if len(points) != int(toy_data["n"]):
        raise PipelineError(f"stage straightdp_figure6_toy: input toy holds {len(points)} points but the declared "
                            f"size data.toy.n is {toy_data['n']} (the release is normalised by it)")
    if int(cfg["toy"]["dpsgd_batch_size"]) >= len(points):
        # q = batch / N = 1 leaves subsampling nothing to amplify: the small eps of the figure would not
        # calibrate, and the error would come from deep inside the accountant's bisection
        raise PipelineError(f"param straightdp.toy.dpsgd_batch_size is {cfg['toy']['dpsgd_batch_size']} but the toy "
                            f"set (data.toy.n) has {len(points)} points: the expected DP-SGD batch must be below it")
    if int(labels.max()) >= int(toy_data["n_modes"]):
        raise PipelineError(f"input toy: labels go up to {int(labels.max())} but toy_data.n_modes is "
                            f"{toy_data['n_modes']}")
    config_id = str(params.get("config_id", "unknown"))
    t_cfg = cfg["toy"]
    rows, entries = [], []
    for seed in t_cfg["seeds"]:
        world = toy.toy_world(points, labels, toy_data=toy_data, cfg=cfg, seed=int(seed))
        public_model = toy.pretrain_public(world, cfg, int(seed))
        truth = toy.truth_draws(toy_data, int(t_cfg["n_eval"]), int(seed))
        rows.append({"row": "public_only", "eps_target": np.nan, "seed": int(seed), "eps_certified": np.nan,
                     "w2": toy.w2_empirical(toy.public_only_samples(public_model, world, cfg, int(seed)), truth),
                     "tau": world.tau, "wall_s": np.nan})
        # this seed's points in the order straightdp_runs.toy_points lists them (the wiring registers their lines)
        for run in toy_points({**t_cfg, "seeds": [seed]}):
            try:
                point = toy.run_point(run, world, public_model, cfg, config_id=config_id)
            except ValueError as exc:
                raise PipelineError(f"stage straightdp_figure6_toy: {exc}") from None
            entries += point.entries
            certified = recompute_cached(composed_entry(point.entries))
            rows.append({"row": run.row, "eps_target": run.epsilon, "seed": run.seed, "eps_certified": certified,
                         "w2": toy.w2_empirical(point.samples, truth),
                         "tau": world.tau if run.distills else 0.0, "wall_s": point.wall_s})
            log.info("toy %s: certified eps %.4g, W2 %.4f (%.1f s)", run.name, certified, rows[-1]["w2"],
                     point.wall_s)
    df = pd.DataFrame(rows)
    over = df[df["eps_certified"] > df["eps_target"] * (1 + 1e-9)]
    if not over.empty:
        r = over.iloc[0]
        raise PipelineError(f"stage straightdp_figure6_toy: {r['row']} at eps {r['eps_target']:g} (seed "
                            f"{r['seed']}) certifies {r['eps_certified']:.6g} > its target")
    df["label"] = df["row"].map(toy.LABELS)
    df["delta"] = float(cfg["delta"])
    df["n_eval"] = int(t_cfg["n_eval"])
    with atomic_path(outputs["ledger"], suffix=".jsonl") as tmp:
        for entry in entries:
            ledger.append_entry(tmp, entry, binding)
    write_table(df, outputs["table"], config_id=config_id)
    plot_w2(df, outputs["figure"])


def plot_w2(df: pd.DataFrame, png: Path) -> None:
    """Fig. 6: W2 vs eps (log), one line per row with a +-1 s.d. band over seeds, the reference dashed."""
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for row in toy.ROWS:
        g = df[df["row"] == row].groupby("eps_target")
        x = np.asarray(sorted(g.groups), dtype=float)
        mean, sd = g["w2"].mean().reindex(x).to_numpy(), g["w2"].std().reindex(x).to_numpy()
        (line,) = ax.plot(x, mean, "o-", ms=4, label=toy.LABELS[row])
        ok = np.isfinite(sd)
        if ok.any():
            ax.fill_between(x[ok], (mean - sd)[ok], (mean + sd)[ok], color=line.get_color(), alpha=0.2, lw=0)
    ref = df[df["row"] == "public_only"]["w2"]
    if not ref.empty:
        ax.axhline(float(ref.mean()), color="grey", ls="--", lw=1, label=toy.LABELS["public_only"])
    ax.set_xscale("log")
    readable_log_axis(ax.xaxis)
    n_seeds = int(df["seed"].nunique())
    ax.set(xlabel=f"privacy budget ε (δ = {float(df['delta'].iloc[0]):g})",
           ylabel="empirical W2 to the true mixture (↓)",
           title=f"STRAIGHTDP Fig. 6: 2-D mixture control (±1 s.d. over {n_seeds} seeds)")
    ax.legend(fontsize=7)
    save_figure(fig, png)
