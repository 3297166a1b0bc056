"""Composed-MNIST (STRAIGHTDP Sec. 4 and Table 4): digits with a quadrant marker and a stroke thickness.

"composed-MNIST extends the release beyond class labels to multi-attribute captions": captions give
the class, a quadrant marker and the stroke thickness. Built here deterministically from any labelled
split (the private digits for the private set, a public split for calibration), image by image:

* thickness ``t`` (0 thin, 1 thick): thick is the digit under a 2 x 2 grey dilation (every stroke one
  pixel wider), thin the digit as is;
* quadrant ``q`` (0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right): a :data:`MARKER` x
  :data:`MARKER` square at full intensity in that corner (the corners of centred digits are empty);
* the caption slots ``(y, q, t)`` (:data:`SLOT_SIZES`), spelt by :func:`caption`; the per-slot
  indicator featurisation is :func:`pipeline.privacy.text_moments.slot_indicators`.

The attributes of a generated image are read back by fixed rules that use no private data and no
trained model (:func:`read_quadrant`; :func:`read_thickness`, a stroke-width rule whose one threshold
:func:`thickness_threshold` fits on the held-out evaluation split, as the eval net is trained); the
class is read by the shared evaluation's eval net, as for every method. Table 4's per-attribute
conditioning accuracy is the fraction of samples whose read attribute equals the caption's. Not yet
wired into a stage (issue #16, Table 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.ndimage import grey_dilation, grey_erosion

from pipeline.io import Split

#: side of the quadrant marker, pixels
MARKER = 3
#: caption slots: class (10 digits), quadrant (4), thickness (2)
SLOT_SIZES = (10, 4, 2)
QUADRANTS = ("top-left", "top-right", "bottom-left", "bottom-right")
THICKNESS = ("thin", "thick")
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


@dataclass(frozen=True)
class ComposedSplit:
    """Composed images (uint8 ``[N, 1, H, W]``) and their caption slots ``[N, 3]`` (class, quadrant, thickness)."""

    images: np.ndarray
    slots: np.ndarray

    def as_split(self) -> Split:
        """The images with their class as the label (what the class-conditional reference release sees)."""
        return Split(self.images, self.slots[:, 0].astype(np.int64))


def corner_slices(size: int, q: int) -> tuple[slice, slice]:
    """Row and column slices of quadrant ``q``'s marker square in a ``size`` x ``size`` image."""
    rows = slice(0, MARKER) if q in (0, 1) else slice(size - MARKER, size)
    cols = slice(0, MARKER) if q in (0, 2) else slice(size - MARKER, size)
    return rows, cols


def thicken(images: np.ndarray) -> np.ndarray:
    """Every stroke one pixel wider: a 2 x 2 grey dilation of uint8 ``[N, 1, H, W]`` images."""
    return grey_dilation(images, size=(1, 1, 2, 2))


def compose(split: Split, *, seed: int) -> ComposedSplit:
    """Composed-MNIST from a labelled grey split: quadrant and thickness drawn uniformly with ``seed``."""
    if split.images.ndim != 4 or split.images.shape[1] != 1:
        raise ValueError(f"composed-MNIST needs grey images [N, 1, H, W], got {list(split.images.shape)}")
    n, _, size, _ = split.images.shape
    if size < 2 * MARKER + 2:
        raise ValueError(f"composed-MNIST needs images of at least {2 * MARKER + 2} pixels, got {size}")
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 4, size=n)
    t = rng.integers(0, 2, size=n)
    images = np.where(t[:, None, None, None] == 1, thicken(split.images), split.images).astype(np.uint8)
    for k in range(4):
        rows, cols = corner_slices(size, k)
        images[q == k, 0, rows, cols] = 255
    return ComposedSplit(images, np.stack([split.labels.astype(np.int64), q, t], axis=1))


def caption(slots: np.ndarray) -> str:
    """The words of one caption, e.g. ``"a thick seven, marked top-right"``."""
    y, q, t = (int(v) for v in slots)
    return f"a {THICKNESS[t]} {DIGITS[y]}, marked {QUADRANTS[q]}"


def read_quadrant(images: np.ndarray) -> np.ndarray:
    """The quadrant whose marker square is brightest in each uint8 image ``[N, 1, H, W]``."""
    size = images.shape[-1]
    means = [images[:, 0, rows, cols].reshape(len(images), -1).mean(axis=1)
             for rows, cols in (corner_slices(size, k) for k in range(4))]
    return np.argmax(np.stack(means, axis=1), axis=1)


def ink_fraction(images: np.ndarray, threshold: int = 128) -> np.ndarray:
    """Fraction of pixels above ``threshold`` outside the four marker squares, per image."""
    size = images.shape[-1]
    mask = np.ones((size, size), dtype=bool)
    for k in range(4):
        mask[corner_slices(size, k)] = False
    return (images[:, 0][:, mask] > threshold).mean(axis=1)


def stroke_survival(images: np.ndarray) -> np.ndarray:
    """Ink left by a 2 x 2 grey erosion over the ink before it, per image: a stroke of width w keeps
    about (w - 1) / w, so a one-pixel stroke keeps ~0 and its thickened version ~1/2, whatever the
    total ink (which depends on the glyph, not on the thickness)."""
    before = ink_fraction(images)
    after = ink_fraction(grey_erosion(images, size=(1, 1, 2, 2)))
    return after / np.maximum(before, 1e-12)


def thickness_threshold(reference: Split, *, seed: int = 0) -> float:
    """The stroke-survival threshold that best separates thin from thick on ``reference`` composed with
    ``seed``: fit on the held-out EVALUATION split (as the eval net is), never on the private split or on
    samples; :func:`read_thickness` then applies it unchanged to every sample set."""
    c = compose(reference, seed=seed)
    survival, thick = stroke_survival(c.images), c.slots[:, 2]
    cuts = np.unique(survival)
    cuts = (cuts[:-1] + cuts[1:]) / 2 if len(cuts) > 1 else cuts
    accuracy = [np.mean((survival > cut) == thick) for cut in cuts]
    return float(cuts[int(np.argmax(accuracy))])


def read_thickness(images: np.ndarray, threshold: float) -> np.ndarray:
    """1 (thick) where an image's stroke survival exceeds ``threshold``, else 0."""
    return (stroke_survival(images) > threshold).astype(np.int64)
