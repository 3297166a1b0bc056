"""The proxy diagnostics' cost model (pipeline/methods/empden_diagnostics/costs.py): more trajectories, more time."""

from __future__ import annotations

from pipeline.config import validate_config
from pipeline.methods.empden_diagnostics import costs


def test_more_trajectories_ask_for_more_time():
    small = validate_config({"empden_diagnostics": {"n_trajectories": 64}})
    large = validate_config({"empden_diagnostics": {"n_trajectories": 20000}})
    assert costs.runtime_min(large) > costs.runtime_min(small)
    assert costs.mem_mb(validate_config({"data": {"image_size": 32}})) > costs.mem_mb(validate_config({}))
