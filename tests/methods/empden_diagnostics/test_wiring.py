"""EMPDEN's proxy diagnostics' wiring (pipeline/methods/empden_diagnostics/wiring.py): targets, params, costs."""

from __future__ import annotations

import copy
import json


from pipeline.methods.accounting.wiring import GRID_KEYS
from pipeline.methods.empden.wiring import Wiring as EmpdenWiring
from pipeline.methods.empden_diagnostics import costs
from pipeline.methods.empden_diagnostics.wiring import Wiring
from pipeline.wiring import House
from tests.methods import check_requests, house


def test_the_diagnostics_report_tables_1_4_5_6_and_figures_1_6(tmp_path):
    t, f = tmp_path / "r" / "tables", tmp_path / "r" / "figures"
    assert Wiring(house(tmp_path)).targets() == [
        t / "empden_table4_proxy.parquet", f / "empden_figure1_proxy_cosine.png",
        t / "empden_table1_window_swap.parquet", t / "empden_table5_endpoint_agreement.parquet",
        t / "empden_table6_image_agreement.parquet", t / "empden_figure6_critical_window.parquet",
        f / "empden_figure6_critical_window.png"]


def test_the_params_hold_the_section_the_mechanism_and_the_samplers_normaliser(tmp_path):
    h = house(tmp_path)
    p = json.loads(Wiring(h).params())
    assert p["diagnostics"] == h.config["empden_diagnostics"] and p["seed"] == 0
    assert not set(GRID_KEYS) & set(p["accounting"]) and p["accounting"]["beta"] == 1.0
    assert p["normaliser"] == "public_marginal" and p["normaliser_n"] is None
    assert p["threads"] == h.torch_threads and p["device"] == h.config["device"]
    # the normaliser is EMPDEN's: the same object's settings reach both
    cfg = copy.deepcopy(dict(h.config))
    cfg["empden"]["normaliser"] = "constant"
    other = House(cfg, h.layout, h.torch_threads)
    assert json.loads(Wiring(other, EmpdenWiring(other)).params())["normaliser"] == "constant"
    # an accounting table grid reruns no diagnostic
    cfg["empden"]["normaliser"] = "public_marginal"
    cfg["accounting"]["B"] = [25]
    assert Wiring(House(cfg, h.layout, h.torch_threads)).params() == Wiring(h).params()


def test_every_rule_asks_for_its_request_in_the_diagnostics_cost_model(tmp_path):
    h = house(tmp_path)
    d = Wiring(h)
    requests = check_requests(d, "empden_diagnostics.smk", costs.REQUESTS)
    swap, proxy = dict(requests["empden_table1_window_swap"]), dict(d.resources("empden_table4_proxy"))
    # the GPU memory: a function of the job, each rule's own prediction (pipeline/methods/empden_diagnostics/costs.py)
    assert swap.pop("gpu_mem_mb")(None) == costs.gpu_memory(h.config, "empden_table1_window_swap").predicted_mb
    assert proxy.pop("gpu_mem_mb")(None) == costs.gpu_memory(h.config, "empden_table4_proxy").predicted_mb
    assert swap == proxy == {"gpu": 1, "mem_mb": costs.mem_mb(h.config), "runtime": costs.runtime_min(h.config)}
