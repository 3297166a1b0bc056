"""The embedded public sets: "printed digits" and "printed letters", rendered from matplotlib's fonts.

Printed digits are a public domain that shares MNIST's labels but not its glyphs (typeset, not
handwritten): public data a private method may use freely (EMPDEN, DPDM). Printed letters
(:data:`LETTERS`, labels 0..9 standing for ten letters) share neither glyphs nor label
meaning with the private digits: the wrong-domain public set STRAIGHTDP needs, playing the role
KMNIST plays for MNIST (STRAIGHTDP Sec. 4, Table 9 "Public pretraining"). Every glyph is rendered once per (font, digit, stroke) at 4× resolution with
matplotlib's Agg rasteriser, then each sample gets a random rotation, scale and shift
(batched ``grid_sample``) and is area-downsampled, so thousands of samples take a second.
Only fonts shipped in ``matplotlib/mpl-data/fonts/ttf`` are used (DejaVu, STIX, Computer
Modern), so nothing is downloaded and the set is identical on every machine.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.patches import PathPatch
from matplotlib.path import Path as MplPath
from matplotlib.textpath import TextPath

from pipeline.io import Split

#: Text fonts with ordinary lining digits (the symbol and math-italic CM fonts are left out).
FONT_FILES = (
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf",
    "STIXGeneral.ttf", "STIXGeneralBol.ttf", "STIXGeneralItalic.ttf", "STIXGeneralBolIta.ttf",
    "cmr10.ttf", "cmss10.ttf", "cmtt10.ttf", "cmb10.ttf", "cmti10.ttf",
)
#: Stroke widths added around the outline, as a fraction of the canvas side.
STROKES = (0.0, 0.025, 0.05)
DIGITS = "0123456789"
#: Ten capitals whose printed shapes are not digit-like (no O/0, I/1, Z/2, S/5, B/8, G/6): a
#: letter's label k has nothing to do with the digit k.
LETTERS = "ACEFHKMRWX"
#: MNIST fits each digit in a 20×20 box of the 28×28 canvas.
GLYPH_BOX = 20 / 28
RENDER_SIZE = 112


def font_paths() -> list[Path]:
    ttf = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    paths = [ttf / f for f in FONT_FILES if (ttf / f).is_file()]
    if not paths:
        raise FileNotFoundError(f"no fonts found in {ttf}: is matplotlib installed completely?")
    return paths


def _glyph_path(font: Path, char: str) -> MplPath:
    """Outline of ``char`` with its bounding box scaled into the centred MNIST 20/28 box."""
    text = TextPath((0, 0), char, size=1.0, prop=FontProperties(fname=str(font)))
    verts = text.vertices
    lo, hi = verts.min(axis=0), verts.max(axis=0)
    return MplPath((verts - (lo + hi) / 2) * (GLYPH_BOX / max(hi - lo)) + 0.5, text.codes)


@lru_cache(maxsize=4)
def glyph_bank(size: int = RENDER_SIZE, chars: str = DIGITS) -> tuple[torch.Tensor, torch.Tensor]:
    """All (font, char, stroke) renders, white on black, as ``[G, 1, S, S]`` floats, and their
    labels (the index of the char in ``chars``).

    One Agg canvas is reused for every glyph (a figure per glyph is much slower); the bank is
    cached per process and must not be modified in place.
    """
    fig = Figure(figsize=(1, 1), dpi=size, facecolor="black")
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_axis_off()
    images, labels = [], []
    for font in font_paths():
        for label, char in enumerate(chars):
            outline = _glyph_path(font, char)
            for stroke in STROKES:
                patch = ax.add_patch(PathPatch(outline, facecolor="white", edgecolor="white",
                                               linewidth=stroke * 72, joinstyle="round"))
                canvas.draw()
                images.append(np.asarray(canvas.buffer_rgba())[..., 0].astype(np.float32) / 255.0)
                labels.append(label)
                patch.remove()
    return torch.from_numpy(np.stack(images))[:, None], torch.tensor(labels)


def printed_digits(n: int, image_size: int, seed: int, **augment: Any) -> Split:
    """``n`` printed digits 0-9 (label = the digit), classes balanced; see :func:`printed_glyphs`."""
    return printed_glyphs(DIGITS, n, image_size, seed, **augment)


def printed_letters(n: int, image_size: int, seed: int, **augment: Any) -> Split:
    """``n`` printed letters (label k = ``LETTERS[k]``), classes balanced; see :func:`printed_glyphs`."""
    return printed_glyphs(LETTERS, n, image_size, seed, **augment)


def printed_glyphs(chars: str, n: int, image_size: int, seed: int, *, max_rotation_deg: float = 12.0,
                   scale_range: tuple[float, float] = (0.8, 1.1), max_shift: float = 0.08) -> Split:
    """``n`` printed ``chars`` (label = index in ``chars``), classes balanced, with random
    rotation/scale/shift per sample.

    Deterministic in ``seed``; ``max_shift`` is a fraction of the image side.
    """
    gen = torch.Generator().manual_seed(seed)
    bank, bank_labels = glyph_bank(RENDER_SIZE, chars)
    k = len(chars)
    labels = torch.arange(n) % k
    labels = labels[torch.randperm(n, generator=gen)]
    # pick a random glyph (font × stroke) of the wanted class for every sample
    per_digit = [torch.nonzero(bank_labels == d).flatten() for d in range(k)]
    choice = torch.stack([per_digit[int(d)][torch.randint(len(per_digit[int(d)]), (1,), generator=gen)][0]
                          for d in labels])
    angle = (torch.rand(n, generator=gen) * 2 - 1) * math.radians(max_rotation_deg)
    scale = scale_range[0] + torch.rand(n, generator=gen) * (scale_range[1] - scale_range[0])
    shift = (torch.rand(n, 2, generator=gen) * 2 - 1) * max_shift * 2  # grid coords span 2
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    out = torch.empty(n, 1, image_size, image_size)
    for start in range(0, n, 1024):
        sl = slice(start, start + 1024)
        src = bank[choice[sl]]
        grid = F.affine_grid(theta[sl], list(src.shape), align_corners=False)
        warped = F.grid_sample(src, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        out[sl] = F.interpolate(warped, size=(image_size, image_size), mode="area")
    images = (out.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    return Split(images, labels.numpy().astype(np.int64))
