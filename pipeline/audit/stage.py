"""Stage ``audit_one_run``: the one-run canary audit of every DP-SGD ledger line (table ``audit_one_run``).

Each line whose mechanism runs through the DP-SGD engine (``dpsgd``: DPDM; ``tha_dpsgd``:
STRAIGHTDP's Stage 2) is rebuilt into the plan its parameters declare (the replay's rebuild),
the engine runs that plan over stand-ins and Dirac canaries (:mod:`pipeline.audit.dpsgd_canaries`),
and the one-run bound gives eps_lb at 95% confidence. A line whose eps_lb exceeds the eps it
claims fails the stage: its run's code is not the mechanism its ledger line declares. Lines of
other mechanisms (EMPDEN's sampling-time blocks, the moment release) are counted in the log and
not audited yet.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline import seeds
from pipeline.audit import dpsgd_canaries
from pipeline.audit.one_run import REFERENCE
from pipeline.privacy import dpsgd, ledger, rebuild, tha
from pipeline.reporting.tables import write_table
from pipeline.stage import PipelineError, stage

log = logging.getLogger(__name__)

seeds.register_streams(
    seeds.Stream("audit.canaries", "a line's canary coins, stand-ins, batches and noise (keys: transcript, line)"),
)

#: mechanism name -> the plan its ledger line declares (the code the replay rebuilds it with)
STEP_PLANS: dict[str, Callable[[ledger.LedgerEntry], dpsgd.StepPlan]] = {
    "dpsgd": rebuild.dpsgd_plan,
    tha.MECHANISM: tha.plan_from_entry,
}


def run_name(entry: ledger.LedgerEntry, transcript: str) -> str:
    """The run a line belongs to: its ``extra.run`` (STRAIGHTDP), else its transcript (DPDM: one per run)."""
    run = entry.extra.get("run")
    return run if isinstance(run, str) else transcript


@stage("audit_one_run", outputs=("table",), any_inputs=True,
       params={"config_id": "id of the configuration", "seed": "the audit's seed",
               "audit": "the config's audit section (canaries, significance)"})
def audit_one_run(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """One-run canary audit of every DP-SGD line of the ledger transcripts (--in NAME=transcript.jsonl ...)."""
    cfg = params["audit"]
    m, significance, seed = int(cfg["canaries"]), float(cfg["significance"]), int(params.get("seed", 0))
    rows, skipped, failed = [], {}, []
    for t_index, (name, path) in enumerate(sorted(inputs.items())):
        for line_no, entry in ledger.read_ledger(path):
            plan_of = STEP_PLANS.get(entry.mechanism)
            plan = plan_of(entry) if plan_of is not None else None
            if plan is None or not dpsgd_canaries.auditable(plan):
                why = entry.mechanism if plan is None else f"{entry.mechanism} with fixed-size batches"
                skipped[why] = skipped.get(why, 0) + 1
                continue
            audit = dpsgd_canaries.audit_plan(plan, certified_epsilon=entry.claimed_epsilon, m=m,
                                              significance=significance,
                                              seed=seeds.seed_of("audit.canaries", seed, t_index, line_no))
            row = {"transcript": name, "line": line_no, "stage": entry.stage, "mechanism": entry.mechanism,
                   "run": run_name(entry, name), "run_config_id": entry.config_id, "run_seed": entry.seed,
                   "sampling_rate": plan.sampling_rate, "noise_std": entry.noise_std,
                   **dpsgd_canaries.summary(audit), "attack": "white-box Dirac gradient canaries",
                   "reference": REFERENCE}
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
