"""Stage ``audit_one_run``: the one-run canary audit of every auditable ledger line (table ``audit_one_run``).

Each line is rebuilt into the mechanism its parameters declare (the replay's rebuild) and the code
that ran it runs that mechanism again over stand-ins and Dirac canaries (Steinke, Nasr & Jagielski
2023, white box):

* DP-SGD lines (``dpsgd``: DPDM; ``tha_dpsgd``: STRAIGHTDP's Stage 2): the training engine, for the
  plan's T steps (:mod:`pipeline.audit.dpsgd_canaries`);
* ``moment_release`` lines (STRAIGHTDP's Stage 1): the feature clip and the release, once
  (:mod:`pipeline.audit.moment_canaries`);
* EMPDEN sampler lines (``empden_outputwise_block``, ``empden_per_step_subsampled``,
  ``empden_full_batch``): the private sampler step, for the block's k steps and N_out outputs
  (:mod:`pipeline.audit.empden_canaries`);
* the baselines' lines (``dp_merf_embedding``, ``pe_nn_histogram``): the mean-embedding release and
  the T vote histograms (:mod:`pipeline.audit.baseline_canaries`).

The one-run bound gives eps_lb at 95% confidence. A line whose eps_lb exceeds the eps it claims fails
the stage: its run's code is not the mechanism its ledger line declares. Fixed-size (replace-one)
DP-SGD lines and EMPDEN's configuration claims (App. G: no sampler ran) are counted in the log and
not audited. Each canary module registers the mechanisms it audits (:mod:`pipeline.audit.hooks`): a new
mechanism's audit is a new module and no edit here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline import seeds
from pipeline.audit import one_run
from pipeline.audit.hooks import audit_hook
from pipeline.audit.one_run import REFERENCE, CanaryAudit
from pipeline.privacy import ledger
from pipeline.reporting.tables import write_table
from pipeline.stage import PipelineError, stage

log = logging.getLogger(__name__)


def audit_line(entry: ledger.LedgerEntry, *, m: int, significance: float, seed: int
               ) -> tuple[CanaryAudit, dict[str, Any]] | str:
    """Audit one line at the plan it declares: (the audit, its sampling_rate and attack columns),
    or, for a line no canary audit applies to, the reason (its mechanism, or its fixed-size batches).
    The code that audits a mechanism registered itself (:mod:`pipeline.audit.hooks`)."""
    hook = audit_hook(entry.mechanism)
    if hook is None:
        return entry.mechanism
    return hook(entry, m=m, significance=significance, seed=seed)


def run_name(entry: ledger.LedgerEntry, transcript: str) -> str:
    """The run a line belongs to: its ``extra.run`` (STRAIGHTDP), else its transcript (DPDM: one per run)."""
    run = entry.extra.get("run")
    return run if isinstance(run, str) else transcript


@stage("audit_one_run", outputs=("table",), any_inputs=True,
       params={"config_id": "id of the configuration", "seed": "the audit's seed",
               "audit": "the config's audit section (canaries, significance)"})
def audit_one_run(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """One-run canary audit of every auditable line of the transcripts (--in NAME=transcript.jsonl ...)."""
    cfg = params["audit"]
    m, significance, seed = int(cfg["canaries"]), float(cfg["significance"]), int(params.get("seed", 0))
    rows, skipped, failed = [], {}, []
    for t_index, (name, path) in enumerate(sorted(inputs.items())):
        for line_no, entry in ledger.read_ledger(path):
            audited = audit_line(entry, m=m, significance=significance,
                                 seed=seeds.seed_of("audit.canaries", seed, t_index, line_no))
            if isinstance(audited, str):
                skipped[audited] = skipped.get(audited, 0) + 1
                continue
            audit, columns = audited
            row = {"transcript": name, "line": line_no, "stage": entry.stage, "mechanism": entry.mechanism,
                   "run": run_name(entry, name), "run_config_id": entry.config_id, "run_seed": entry.seed,
                   "noise_std": entry.noise_std, **columns, **one_run.summary(audit), "reference": REFERENCE}
            rows.append(row)
            log.info("audit %s line %d (%s): eps_lb %.3f (95%%) vs certified %.4f: %s", name, line_no, row["run"],
                     audit.bound.epsilon_lb, entry.claimed_epsilon, "ok" if audit.passed else "REFUTED")
            if not audit.passed:
                failed.append(f"{name} line {line_no} ({row['run']}): eps_lb {audit.bound.epsilon_lb:.4g} > "
                              f"certified {entry.claimed_epsilon:.4g}")
    if skipped:
        log.info("not audited (no canary audit for these mechanisms yet): %s",
                 ", ".join(f"{k} x{v}" for k, v in sorted(skipped.items())))
    if failed:
        raise PipelineError("stage audit_one_run: the one-run audit refutes a certified eps (the code is not the "
                            "mechanism its ledger line declares): " + "; ".join(failed))
    columns = ["transcript", "line", "stage", "mechanism", "run", "run_config_id", "run_seed", "canaries",
               "canaries_in", "steps", "sampling_rate", "noise_std", "confidence", "delta", "epsilon_lb",
               "certified_epsilon", "passed", "mean_score_in", "mean_score_out", "attack", "reference"]
    df = pd.DataFrame(rows, columns=columns)
    write_table(df, outputs["table"], config_id=str(params.get("config_id", "unknown")), seed=seed)
