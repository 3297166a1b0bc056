"""Figures: every figure is written as PNG (for the index page) and PDF (for papers)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless clusters and CI have no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from pipeline.io import atomic_path  # noqa: E402


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
