"""EMPDEN Figures 4, 5, 7 (full-batch GDP from the EDM schedule)."""

from __future__ import annotations

import math

import pytest

from pipeline.accounting import figures
from pipeline.accounting.empden import AccountingConfig
from pipeline.config import validate_config
from pipeline.privacy import accountants as acc


def params() -> dict:
    return {"accounting": validate_config({})["accounting"], "n": 3000}


@pytest.mark.parametrize("stage_fn", [figures.empden_figure4_full_batch, figures.empden_figure5_mu_vs_logsnr,
                                      figures.empden_figure7_stopping_traces])
def test_figures_are_written_as_png_and_pdf(tmp_path, stage_fn):
    stage_fn({}, {"figure": tmp_path / "f.png"}, params())
    assert (tmp_path / "f.png").stat().st_size > 0 and (tmp_path / "f.pdf").stat().st_size > 0


def test_full_batch_eps_matches_empden_section_6_1():
    # "eps ~ 200 when denoising down to sigma_min = 0.1 ... at eps ~ 1 (sigma_min = 5)", N = 50.
    cfg = AccountingConfig.from_params(params())
    assert acc.gdp_epsilon(1e-5, figures.full_batch_mu(cfg, 0.1)) == pytest.approx(200, rel=0.1)
    assert acc.gdp_epsilon(1e-5, figures.full_batch_mu(cfg, 5.0)) == pytest.approx(1.0, rel=0.35)


def test_stopping_earlier_leaks_less():
    cfg = AccountingConfig.from_params(params())
    mus = [figures.full_batch_mu(cfg, cfg.sigma_min, k) for k in figures.stopping_steps(cfg.N_full_batch)]
    assert mus == sorted(mus) and figures.stopping_steps(50)[0] == 4 and figures.stopping_steps(50)[-1] == 49


def test_trade_off_curve_is_gaussian_dp():
    assert figures.trade_off(0.05, 0.0) == pytest.approx(0.95)
    assert figures.trade_off(0.05, 1.0) == pytest.approx(0.7405, abs=1e-4)  # Phi(1.645 - 1)
    assert math.isclose(figures.trade_off(1.0, 2.0), 0.0, abs_tol=1e-12)
