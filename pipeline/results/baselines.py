"""Stage ``baselines_table``: the baselines' runs (DP-MERF, Private Evolution) as one Parquet table.

The same row layout as all_runs.parquet (:func:`pipeline.results.all_runs.run_rows`): the shared
evaluation's metrics and the certified eps recomputed from each run's transcript. A run whose certified
eps exceeds its target fails the stage (the calibration promised otherwise). Its cost is in all_runs'
``cost_*`` columns: the runtime table is measured after every other job, this one included.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.reporting.tables import write_table
from pipeline.results.all_runs import checked_runs, run_rows
from pipeline.stage import PipelineError, stage




@stage("baselines_table", outputs=("table",), any_inputs=True,
       params={"runs": "the baseline runs, as all_runs_table's", "config_id": "id of the settings"})
def baselines_table(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """The baselines' rows: metrics and certified eps (<= each run's target, else the stage fails)."""
    df = run_rows(inputs, checked_runs(params))
    over = df[df["eps_certified"] > df["epsilon_target"]]
    if len(over):
        r = over.iloc[0]
        raise PipelineError(f"stage baselines_table: {r['method']}/{r['config']} certified eps "
                            f"{r['eps_certified']:.6g} "
                            f"> its target {r['epsilon_target']:g}")
    write_table(df.drop(columns=["in_figure", "headline"]), outputs["table"],
                config_id=str(params.get("config_id", "unknown")))
