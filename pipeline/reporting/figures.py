"""Figures: every figure is written as PNG (for the index page) and PDF (for papers)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")  # headless clusters and CI have no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axis import Axis  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, Locator, NullFormatter  # noqa: E402

from pipeline.io import Split, atomic_path  # noqa: E402


def save_figure(fig: Figure, png_path: str | Path, *, dpi: int = 150) -> tuple[Path, Path]:
    """Save ``fig`` to ``png_path`` and the same stem with ``.pdf``; close it."""
    png = Path(png_path)
    if png.suffix != ".png":
        raise ValueError(f"{png}: figure path must end in .png (the .pdf is written beside it)")
    pdf = png.with_suffix(".pdf")
    for path, fmt in ((png, "png"), (pdf, "pdf")):
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return png, pdf


#: Mantissas of the tick positions in a decade, finest first: the finest set that gives at most
#: ``max_ticks`` ticks in view is used, so a narrow eps range still shows a few labelled ticks.
_MANTISSAS: tuple[tuple[float, ...], ...] = ((1, 1.5, 2, 3, 4, 5, 6, 8), (1, 2, 3, 5), (1, 2, 5), (1, 3), (1,))


def log_tick_values(lo: float, hi: float, max_ticks: int = 6) -> list[float]:
    """Tick positions for a log axis over [lo, hi]: at most ``max_ticks``, at 1-2-5-like mantissas.

    Falls back to every k-th power of ten over wide ranges. Unlike matplotlib's default log
    locator with labelled minor ticks, no two labels crowd each other within a decade.
    """
    if not (0 < lo < hi and math.isfinite(hi)):
        return []
    e_lo, e_hi = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for mantissas in _MANTISSAS:
        ticks = [m * 10.0**e for e in range(e_lo, e_hi + 1) for m in mantissas if lo <= m * 10.0**e <= hi]
        if len(ticks) <= max_ticks:
            return ticks
    decades = [e for e in range(e_lo, e_hi + 1) if lo <= 10.0**e <= hi]
    stride = math.ceil(len(decades) / max_ticks)
    return [10.0**e for e in decades[::stride]]


class ReadableLogLocator(Locator):
    """:func:`log_tick_values` of the axis' current view (recomputed at every draw)."""

    def __init__(self, max_ticks: int = 6):
        self.max_ticks = max_ticks

    def __call__(self) -> Sequence[float]:
        lo, hi = sorted(self.axis.get_view_interval())
        return self.tick_values(lo, hi)

    def tick_values(self, vmin: float, vmax: float) -> Sequence[float]:
        return log_tick_values(min(vmin, vmax), max(vmin, vmax), self.max_ticks)


def _plain_number(value: float, _pos: int | None = None) -> str:
    return f"{value:g}"


def readable_log_axis(axis: Axis, max_ticks: int = 6) -> None:
    """Label a log-scaled axis with at most ``max_ticks`` plain numbers (0.5, 2, 100) and unlabelled minor ticks."""
    axis.set_major_locator(ReadableLogLocator(max_ticks))
    axis.set_major_formatter(FuncFormatter(_plain_number))
    axis.set_minor_formatter(NullFormatter())


def sample_grid_figure(panels: Mapping[str, Split], *, per_class: int = 8, title: str | None = None):
    """One panel per split: a row of ``per_class`` images for each class (columns = samples)."""
    width = 0.4 * per_class
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 0.4 * 10 + 0.6), squeeze=False)
    for ax, (name, split) in zip(axes[0], panels.items()):
        rows = []
        for c in np.unique(split.labels):
            idx = np.flatnonzero(split.labels == c)[:per_class]
            imgs = split.images[idx].transpose(0, 2, 3, 1)
            if len(imgs) < per_class:  # pad short classes with black so the grid stays rectangular
                imgs = np.concatenate([imgs, np.zeros((per_class - len(imgs), *imgs.shape[1:]), np.uint8)])
            rows.append(np.concatenate(list(imgs), axis=1))
        grid = np.concatenate(rows, axis=0)
        ax.imshow(grid.squeeze(-1) if grid.shape[-1] == 1 else grid, cmap="gray", vmin=0, vmax=255)
        ax.set_title(name, fontsize=9)
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
