"""SENSGEO's wiring (pipeline/methods/sensgeo/wiring.py): its targets and each rule's params."""

from __future__ import annotations

import copy
import json

import pytest

from pipeline.config import config_id
from pipeline.methods.sensgeo import costs
from pipeline.methods.sensgeo.wiring import SECTIONS, Wiring
from pipeline.wiring import House
from tests.methods import check_requests, house


def test_sensgeo_reports_two_figures_and_five_tables_top_level(tmp_path):
    t, f = tmp_path / "r" / "tables", tmp_path / "r" / "figures"
    assert Wiring(house(tmp_path)).targets() == [
        f / "sensgeo_fig1_naive_vs_exact.png", t / "sensgeo_fig1_naive_vs_exact.parquet",
        t / "sensgeo_table_guarantees.parquet", t / "sensgeo_table_sdp.parquet", f / "sensgeo_fig_mi_snr.png",
        t / "sensgeo_table_bridge.parquet"]


@pytest.mark.parametrize("section", SECTIONS)
def test_a_rule_depends_on_its_own_section_and_the_seed_only(tmp_path, section):
    h = house(tmp_path)
    p = json.loads(Wiring(h).params(section))
    sg = h.config["sensgeo"]
    assert p == {"seed": sg["seed"], section: sg[section], "config_id": config_id({"seed": sg["seed"],
                                                                                    section: sg[section]})}
    # another section's edit reruns nothing of this one; a new seed reruns every one
    other = next(s for s in SECTIONS if s != section)
    cfg = copy.deepcopy(dict(h.config))
    cfg["sensgeo"][other] = {**cfg["sensgeo"][other], "edited": 1}
    assert Wiring(House(cfg, h.layout, 1)).params(section) == Wiring(h).params(section)
    cfg["sensgeo"]["seed"] = 7
    assert json.loads(Wiring(House(cfg, h.layout, 1)).params(section))["seed"] == 7


def test_an_unknown_section_is_refused(tmp_path):
    with pytest.raises(KeyError, match="SENSGEO has no section 'fig2'"):
        Wiring(house(tmp_path)).params("fig2")


def test_every_rule_asks_for_its_request_in_sensgeo_s_cost_model(tmp_path):
    h = house(tmp_path)
    sg = Wiring(h)
    check_requests(sg, "sensgeo.smk", costs.REQUESTS)
    assert sg.resources("sensgeo_table_sdp") == {"mem_mb": 3000, "runtime": costs.sdp_runtime_min(h.config)}
