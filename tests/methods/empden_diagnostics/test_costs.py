"""The proxy diagnostics' cost model (pipeline/methods/empden_diagnostics/costs.py): more trajectories, more time."""

from __future__ import annotations

from pipeline.config import validate_config
from pipeline.methods.empden_diagnostics import costs


def test_more_trajectories_ask_for_more_time():
    small = validate_config({"empden_diagnostics": {"n_trajectories": 64}})
    large = validate_config({"empden_diagnostics": {"n_trajectories": 20000}})
    assert costs.runtime_min(large) > costs.runtime_min(small)
    assert costs.mem_mb(validate_config({"data": {"image_size": 32}})) > costs.mem_mb(validate_config({}))


def test_a_diagnostics_jobs_gpu_memory_holds_the_public_unets_batch_its_trajectories_and_the_private_block():
    import pytest

    import pipeline.resources as cost
    from pipeline import footprint
    from pipeline.config import load_config
    from pipeline.methods.empden import costs as empden_costs
    from tests.conftest import REPO

    cifar10 = load_config(REPO / "config.yaml", REPO / "configs" / "cifar10.yaml")
    diag, d = cifar10["empden_diagnostics"], 3 * 32 * 32
    b = diag["batch_size"]
    unet = footprint.footprint("edm_unet", cost.pretrain_network(cifar10))
    public = 4 * unet.params + cost.TRANSIENT_FACTOR * unet.forward_peak_bytes(b) + cost.GPU_RESERVE_BYTES
    private = (3 * empden_costs.private_records(cifar10) * d * 8 + 8 * b * empden_costs.private_records(cifar10) * 8
               + 8 * empden_costs.normaliser_records(cifar10) * d)
    for rule, N, reads_private in (("empden_table4_proxy", diag["proxy_N"], True),
                                   ("empden_table1_window_swap", diag["swap_N"], True),
                                   ("empden_figure6_critical_window", diag["critical_window_N"], False)):
        trajectories = (4 * N + 2) * b * d * 4
        assert costs.gpu_memory(cifar10, rule).predicted_bytes == pytest.approx(
            public + trajectories + (private if reads_private else 0)), rule
        assert costs.gpu_memory(cifar10, rule).predicted_bytes < cost.gpu_mem_bytes(cifar10)
    # a larger batch of trajectories holds more
    cifar10["empden_diagnostics"]["batch_size"] = 4 * b
    assert costs.gpu_memory(cifar10, "empden_table4_proxy").predicted_bytes > public + private
