"""The public "printed digits" and "printed letters" sets: balanced, deterministic, and not MNIST."""

from __future__ import annotations

import numpy as np

from pipeline.data.printed_digits import DIGITS, LETTERS, font_paths, printed_digits, printed_glyphs, printed_letters


def test_balanced_and_deterministic():
    a = printed_digits(300, 16, seed=1)
    b = printed_digits(300, 16, seed=1)
    c = printed_digits(300, 16, seed=2)
    assert a.images.shape == (300, 1, 16, 16) and a.images.dtype == np.uint8
    assert np.bincount(a.labels).tolist() == [30] * 10
    np.testing.assert_array_equal(a.images, b.images)
    assert not np.array_equal(a.images, c.images)


def test_glyphs_are_centred_ink_on_black():
    s = printed_digits(200, 28, seed=0)
    assert (s.images.reshape(200, -1).max(1) > 150).all(), "every digit has ink"
    assert s.images[:, :, :2, :].mean() < 5 and s.images[:, :, :, :2].mean() < 5, "borders stay dark"


def test_uses_several_font_families():
    names = {p.name for p in font_paths()}
    assert any(n.startswith("DejaVu") for n in names)
    assert any(n.startswith("STIX") for n in names)
    assert any(n.startswith("cm") for n in names)


def test_classes_differ_from_each_other():
    # per-class mean images must be far apart: labels really describe the glyphs
    s = printed_digits(1000, 16, seed=0)
    means = np.stack([s.images[s.labels == d].astype(float).mean(0).ravel() for d in range(10)])
    dist = np.linalg.norm(means[:, None] - means[None], axis=-1)
    assert dist[~np.eye(10, dtype=bool)].min() > 100


def test_printed_letters_are_balanced_deterministic_and_not_digits():
    # STRAIGHTDP's wrong-domain public set: ten letter classes, none a digit's glyph
    a, b = printed_letters(500, 16, seed=0), printed_letters(500, 16, seed=0)
    np.testing.assert_array_equal(a.images, b.images)
    assert np.bincount(a.labels).tolist() == [50] * 10
    assert not set(LETTERS) & set("0123456789OoIlZSBGgq")
    digits = printed_digits(500, 16, seed=0)
    # each letter class's mean image is far from EVERY digit class's mean image
    mean = lambda s, k: s.images[s.labels == k].astype(float).mean(0).ravel()  # noqa: E731
    dist = np.array([[np.linalg.norm(mean(a, i) - mean(digits, j)) for j in range(10)] for i in range(10)])
    assert dist.min() > 100


def test_digits_unchanged_by_the_letter_generalisation():
    # printed_digits is printed_glyphs over "0123456789": same images as before letters existed
    np.testing.assert_array_equal(printed_digits(64, 16, seed=5).images,
                                  printed_glyphs(DIGITS, 64, 16, seed=5).images)
