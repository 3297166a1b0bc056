"""Stage ``dpdm_select_sampler``: DPDM's main sampler, chosen on the validation split.

DPDM picks its sampler per dataset by a search over samplers for downstream accuracy (App.
F.4.3). Here the search reads the sampler ablation (every sampler of
``dpdm.sampler_ablation.samplers`` on the main run of each of its epsilons) and takes the
sampler with the best downstream CNN accuracy on ``val`` (:data:`pipeline.methods.dpdm.runs.SELECT_BY`),
averaged over the ablation's epsilons. ``test`` never enters: the main table then scores the
chosen sampler on ``test``. The choice reads only evaluations of samples (post-processing of
the DP runs), so it spends no privacy budget.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.io import read_json, write_json
from pipeline.stage import PipelineError, stage
from pipeline.methods.dpdm.runs import SELECT_BY, mean_scores, select_sampler

log = logging.getLogger(__name__)


@stage("dpdm_select_sampler", outputs=("selection",), any_inputs=True,
       params={"rows": "the sampler ablation's rows ({row, sampler, eps_target, ...}); each reads --in metrics_ROW=",
               "config_id": "id of the configuration"})
def dpdm_select_sampler(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """The sampler of the ablation with the best mean validation CNN accuracy (JSON: sampler, scores, split)."""
    rows = params.get("rows") or []
    if not rows:
        raise PipelineError("stage dpdm_select_sampler: params.rows is empty (dpdm.sampler_ablation is null?)")
    scores: dict[str, list[float]] = {}
    per_row = {}
    for r in rows:
        key = f"metrics_{r['row']}"
        if key not in inputs:
            raise PipelineError(f"stage dpdm_select_sampler: row {r['row']!r} needs --in {key}=PATH")
        value = read_json(inputs[key]).get(SELECT_BY)
        if value is None:
            raise PipelineError(f"input {key}: {inputs[key]} has no {SELECT_BY} (evaluate the samples with "
                                f"--in val=...); the choice is made on the validation split only")
        scores.setdefault(str(r["sampler"]), []).append(float(value))
        per_row[str(r["row"])] = float(value)
    sampler, means = select_sampler(scores), mean_scores(scores)
    log.info("dpdm_select_sampler: %s (mean %s over %d eps) from %s", sampler, SELECT_BY,
             len(next(iter(scores.values()))), {k: round(v, 4) for k, v in means.items()})
    write_json(outputs["selection"], {"format": "dpgen-selection/1", "sampler": sampler, "criterion": SELECT_BY,
                                      "split": "val", "mean_scores": means, "scores_by_row": per_row,
                                      "config_id": params.get("config_id")})
