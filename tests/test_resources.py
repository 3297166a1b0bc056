"""Job costs (pipeline.resources): pure functions of the config that grow with the work they bound."""

from __future__ import annotations

import inspect

import pytest

import pipeline.resources as cost
from pipeline.config import validate_config


def config(**sections):
    return validate_config(sections)


LIMIT_ARITHMETIC = ("max_job_minutes", "segments", "segment_runtime_min", "segment_retries")


def test_every_cost_model_is_a_positive_integer_of_the_default_config():
    cfg = config()
    for name, fn in inspect.getmembers(cost, inspect.isfunction):
        # the time-limit arithmetic takes a prediction and may say "no limit" (tests/test_plan.py)
        if name.startswith("_") or fn.__module__ != cost.__name__ or name in LIMIT_ARITHMETIC:
            continue
        args = (cfg, 20) if name in ("accounting_runtime_min", "audit_runtime_min") else (cfg,)
        value = fn(*args)
        assert isinstance(value, int) and value > 0, name


@pytest.mark.parametrize(("fn", "small", "large"), [
    (cost.dpdm_train_runtime_min, {"dpdm": {"epochs": 8}}, {"dpdm": {"epochs": 80000}}),
    (cost.dpdm_train_mem_mb, {"dpdm": {"K": 1}}, {"dpdm": {"K": 32}}),
    (cost.dpdm_sample_runtime_min, {"dpdm": {"sampling": {"n_samples": 500}}},
     {"dpdm": {"sampling": {"n_samples": 50000}}}),
    (cost.empden_sample_runtime_min, {"empden": {"n_out": 100}}, {"empden": {"n_out": 100000}}),
    # a shard asks for its share of the cell's time (100,000 outputs in batches of 256: 391 batches)
    (cost.empden_sample_runtime_min, {"empden": {"n_out": 100000}, "sampling": {"shards": 8}},
     {"empden": {"n_out": 100000}, "sampling": {"shards": 2}}),
    (cost.empden_gather_mem_mb, {"empden": {"n_out": 1000}}, {"empden": {"n_out": 1000000}}),
    (cost.empden_diagnostics_runtime_min, {"empden_diagnostics": {"n_trajectories": 64}},
     {"empden_diagnostics": {"n_trajectories": 20000}}),
    (cost.evalnet_runtime_min, {"evaluation": {"evalnet": {"epochs": 1}}},
     {"evaluation": {"evalnet": {"epochs": 1000}}}),
    (cost.pretrain_runtime_min, {"pretrain": {"steps": 100}}, {"pretrain": {"steps": 100000}}),
])
def test_a_bigger_job_asks_for_more(fn, small, large):
    assert fn(config(**large)) > fn(config(**small))


def test_a_finer_pld_grid_costs_more_per_accounted_block():
    coarse, fine = config(), config(accounting={"discretisation": 1e-5})
    assert cost.accounting_runtime_min(coarse, 20) == 30 + 20
    assert cost.accounting_runtime_min(fine, 20) == 30 + 20 * 10
    assert cost.accounting_mem_mb(fine) > cost.accounting_mem_mb(coarse)


def test_only_images_above_16x16_get_more_than_one_torch_thread():
    assert cost.torch_threads(config()) == 1
    assert cost.torch_threads(config(data={"image_size": 32})) == 4
