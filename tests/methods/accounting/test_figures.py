"""EMPDEN Figures 4, 5, 7 (full-batch GDP from the EDM schedule)."""

from __future__ import annotations

import math

import pytest

from pipeline.methods.accounting import figures
from pipeline.methods.accounting.blocks import AccountingConfig
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


# --------------------------------------------------------------------------- legibility
# Each figure is rendered by its stage as the pipeline runs it; ``save_figure`` is wrapped so
# the test can inspect the drawn figure (tick label boxes, scales, labels, legends).

import itertools  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from pipeline.methods.empden import results as empden_results  # noqa: E402
from pipeline.methods.sensgeo import tables as sensgeo  # noqa: E402
from pipeline.reporting import figures as reporting_figures  # noqa: E402
from pipeline.reporting import write_table  # noqa: E402


@pytest.fixture
def drawn(monkeypatch):
    """Patch a module's ``save_figure`` so every figure it would save is drawn and kept open for inspection."""
    figs: list[Figure] = []

    def patch(module) -> list[Figure]:
        def keep(fig, path, **kwargs):
            fig.canvas.draw()
            figs.append(fig)

        monkeypatch.setattr(module, "save_figure", keep)
        return figs

    yield patch
    for fig in figs:
        plt.close(fig)


def visible_tick_labels(ax: Axes, which: str = "x") -> list:
    """The tick labels of ``ax`` that are drawn with text and lie inside the axis' view interval."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    lo, hi = sorted(axis.get_view_interval())
    ticks = [*axis.get_major_ticks(), *axis.get_minor_ticks()]
    return [t.label1 for t in ticks if t.label1.get_visible() and t.label1.get_text()
            and lo <= t.get_loc() <= hi]


def overlapping_labels(fig: Figure, labels: list) -> list[tuple[str, str]]:
    renderer = fig.canvas.get_renderer()
    boxes = [(lab.get_text(), lab.get_window_extent(renderer)) for lab in labels]
    return [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)]


def narrow_eps_grid(path, eps_scale: float) -> None:
    """A Table-8-like grid (hybrid cells p x B x T) whose eps_u spans ~a decade, as the embedded default's does."""
    n = 2500
    rows = [dict(method="hybrid", beta=1.0, seed=0, p_percent=float(p), B=B, T=T, n=n, q_B=B / n, delta=1e-5,
                 eps_upper_bound=eps_scale * (p / 30) ** 2 * (B / 100) * (1 + 0.1 * T), fid=200.0 - p - B / 20 + T)
            for p, B, T in itertools.product((30, 40, 50), (100, 200), (1, 3))]
    write_table(pd.DataFrame(rows), path, config_id="test")


@pytest.mark.parametrize("eps_scale", [0.03, 2.0, 40.0])
def test_figure3_eps_tick_labels_do_not_overlap(tmp_path, drawn, eps_scale):
    figs = drawn(empden_results)
    narrow_eps_grid(tmp_path / "grid.parquet", eps_scale)
    empden_results.empden_figure3_tradeoffs({"grid": tmp_path / "grid.parquet"}, {"figure": tmp_path / "f3.png"},
                                            {"beta": 1.0, "seed": 0})
    (fig,) = figs
    for ax in fig.axes:
        labels = visible_tick_labels(ax)
        assert ax.get_xscale() == "log"
        assert len(labels) >= 2, f"{ax.get_title()}: fewer than two labelled eps ticks"
        assert not overlapping_labels(fig, labels), ax.get_title()
        assert ax.get_legend().get_title().get_text(), f"{ax.get_title()}: legend does not say what its lines are"


@settings(max_examples=200, deadline=None)
@given(lo_exp=st.floats(-8, 6), span=st.floats(0.05, 14), max_ticks=st.integers(3, 8))
def test_log_ticks_stay_in_range_and_few(lo_exp, span, max_ticks):
    lo, hi = 10.0**lo_exp, 10.0 ** (lo_exp + span)
    ticks = reporting_figures.log_tick_values(lo, hi, max_ticks)
    assert len(ticks) <= max_ticks
    assert all(lo <= t <= hi for t in ticks) and ticks == sorted(set(ticks))
    if span >= 1:  # a whole decade always holds a power of ten
        assert ticks


def test_figure7_shows_every_stopping_time_on_a_log_eps_axis(tmp_path, drawn):
    figs = drawn(figures)
    figures.empden_figure7_stopping_traces({}, {"figure": tmp_path / "f7.png"}, params())
    (fig,) = figs
    left, right = fig.axes
    assert left.get_xscale() == "log"
    lo, hi = sorted(left.get_xlim())
    traces = [line for line in left.get_lines() if np.ptp(line.get_ydata()) > 0]  # not the delta reference line
    assert len(traces) == len(figures.stopping_steps(params()["accounting"]["N_full_batch"]))
    # where each trace crosses the config's delta, in pixels: on a linear axis the weak mechanisms'
    # eps (< 1) and the strong ones' (> 1e4) leave the first ones on top of each other at x = 0
    delta = params()["accounting"]["delta"]
    at_delta = []
    for line in traces:
        x, y = (np.asarray(v, dtype=float) for v in line.get_data())
        i = np.nanargmin(np.where(np.isfinite(x), np.abs(np.log(y / delta)), np.nan))
        assert lo <= x[i] <= hi
        at_delta.append(left.transData.transform((x[i], delta))[0])
    gaps = np.diff(sorted(at_delta))
    assert gaps.min() > 3, f"traces within {gaps.min():.1f} px of each other at delta = {delta:g}"
    assert not overlapping_labels(fig, visible_tick_labels(left))
    legend = right.get_legend()
    assert "step" in legend.get_title().get_text()
    assert len(legend.get_texts()) == len(traces) + 1  # every trace and the indistinguishable line
    for ax in (left, right):
        assert ax.get_xlabel() and ax.get_ylabel()
    assert "nats" in left.get_xlabel()


def test_mi_snr_figure_labels_its_axes_and_explains_its_reference_lines(tmp_path, drawn):
    figs = drawn(sensgeo)
    cfg = validate_config({"sensgeo": {"mi": {"n_points": 20, "kappa": [0.01, 0.3]}}})["sensgeo"]
    sensgeo.sensgeo_fig_mi_snr({}, {"figure": tmp_path / "mi.png"}, {"config_id": "t", "seed": 0, "mi": cfg["mi"]})
    (fig,) = figs
    channel, calibration = fig.axes
    for ax in fig.axes:
        assert ax.get_xlabel() and ax.get_ylabel()
    entries = [t.get_text() for t in channel.get_legend().get_texts()]
    assert any("log 2" in e for e in entries), "the log 2 line is not explained"
    assert any("κ" in e for e in entries), "the MI budget lines are not explained"
    # every horizontal reference line is either labelled or styled like a labelled legend entry
    styles = {(h.get_linestyle(), h.get_color()) for h in channel.get_legend().legend_handles}
    for line in channel.get_lines():
        y = np.asarray(line.get_ydata(), dtype=float)
        if y.size and np.ptp(y) == 0:
            assert (line.get_linestyle(), line.get_color()) in styles, f"unexplained line at y = {y[0]:g}"
