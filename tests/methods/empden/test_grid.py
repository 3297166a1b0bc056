"""The EMPDEN grid of a config: the paper's 95 / 112 configurations, cell paths, wildcards round trip."""

from __future__ import annotations

from collections import Counter

import pytest

from pipeline.config import load_config
from pipeline.methods.empden.grid import Cell, cell_from_wildcards, fmt_num, grid_cells, parse_num


def _main_grid(cfg) -> list[Cell]:
    cells = grid_cells(cfg["empden"], cfg["accounting"])
    return [c for c in cells if c.method == "hybrid" and c.seed == cfg["empden"]["seeds"][0]
            and c.beta == cfg["accounting"]["beta"]]


@pytest.mark.parametrize(("preset", "n_configurations"), [("cifar10", 95), ("celeba64", 112)])
def test_paper_presets_hold_the_papers_full_grids(repo, preset, n_configurations):
    """EMPDEN App. J: 95 CIFAR-10 (Table 8) and 112 CelebA-64 (Table 9) configurations."""
    cfg = load_config(repo / "config.yaml", repo / "configs" / f"{preset}.yaml")
    assert len(_main_grid(cfg)) == n_configurations


def test_cifar10_grid_is_t_by_p_by_b_without_p70_b200(repo):
    cfg = load_config(repo / "config.yaml", repo / "configs" / "cifar10.yaml")
    cells = {(c.p_percent, c.B, c.T) for c in _main_grid(cfg)}
    assert (70.0, 200, 3) not in cells and (67.0, 200, 9) in cells
    assert Counter(c.T for c in _main_grid(cfg)) == {1: 19, 3: 19, 5: 19, 7: 19, 9: 19}


def test_embedded_default_has_the_reference_rows_and_every_ablation(repo):
    cfg = load_config(repo / "config.yaml")
    cells = grid_cells(cfg["empden"], cfg["accounting"])
    methods = Counter(c.method for c in cells)
    assert methods["public_only"] == 1 and methods["full_batch"] >= 1 and methods["per_step"] == 1
    main = _main_grid(cfg)
    assert len({c.p_percent for c in main}) >= 2 and len({c.B for c in main}) >= 2
    ab = cfg["empden"]["beta_ablation"]
    assert {c.beta for c in cells if (c.p_percent, c.B, c.T) == (ab["p"], ab["B"], ab["T"])} >= set(ab["beta"])
    assert len(cells) == len(set(cells))


def test_cell_names_have_no_dots_and_round_trip_through_wildcards():
    cell = Cell("hybrid", seed=2, beta=0.25, p_percent=62.5, B=50, T=3)
    assert cell.name == "hybrid/p62p5_B50_T3_beta0p25_s2"
    assert "." not in cell.name and "." not in cell.ledger_stem
    wc = {"p": "62p5", "B": "50", "T": "3", "beta": "0p25", "seed": "2"}
    assert cell_from_wildcards("hybrid", wc) == cell
    fb = Cell("full_batch", seed=0, beta=1.0, sigma_min=0.002)
    assert fb.name == "full_batch/smin0p002_beta1_s0"
    assert cell_from_wildcards("full_batch", {"smin": "0p002", "beta": "1", "seed": "0"}) == fb
    assert parse_num(fmt_num(0.002)) == 0.002 and fmt_num(55) == "55"


def test_a_cell_missing_its_symbols_is_refused():
    with pytest.raises(ValueError, match="needs p_percent, B, T"):
        Cell("hybrid", seed=0, beta=1.0)
    with pytest.raises(ValueError, match="method must be one of"):
        Cell("dpdm", seed=0)
