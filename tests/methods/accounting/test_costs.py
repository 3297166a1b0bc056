"""The accounting's cost model (pipeline/methods/accounting/costs.py): a job that accounts every block asks for more
per block on a finer PLD grid."""

from __future__ import annotations

from pipeline.config import validate_config
from pipeline.methods.accounting import costs


def test_a_finer_pld_grid_costs_more_per_accounted_block():
    coarse, fine = validate_config({}), validate_config({"accounting": {"discretisation": 1e-5}})
    assert costs.runtime_min(coarse, 20) == 30 + 20
    assert costs.runtime_min(fine, 20) == 30 + 20 * 10
    assert costs.mem_mb(fine) > costs.mem_mb(coarse)
    assert costs.blocks_request(fine).runtime == 30 + costs.n_blocks(fine) * 10
