"""cvae/evaluation/label_swap.py: the handwriting measures on drawn shapes, and the scores of swaps
whose right answers are known (drawn bars: their class is where they stand, their hand is their lean
and width)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cvae.evaluation.label_swap import (correlation, omitted_because, scores, slant,
                                        standardised, stroke_width, summary_lines)


def bar(width: int, shear: float = 0.0) -> np.ndarray:
    """A vertical bar 20 rows tall and `width` px wide, its top moved right by `shear` px/row."""
    image = np.zeros((28, 28), np.float32)
    for row in range(4, 24):
        left = round(12 + shear * (23 - row))
        image[row, left:left + width] = 1.0
    return image


def test_slant_is_the_shear_of_the_ink():
    images = np.stack([bar(3, shear) for shear in (-0.4, 0.0, 0.2, 0.4)])
    np.testing.assert_allclose(slant(images), [-0.4, 0.0, 0.2, 0.4], atol=0.03)


def test_stroke_width_grows_with_the_stroke():
    widths = stroke_width(np.stack([bar(w) for w in (1, 2, 3, 5)]))
    assert np.all(np.diff(widths) > 0)
    assert widths[2] == pytest.approx(20 * 3 / (20 + 3))  # area / half the perimeter
    assert stroke_width(np.zeros((1, 28, 28)))[0] == 0.0


def test_correlation_of_something_constant_is_undefined():
    assert np.isnan(correlation(np.ones(5), np.arange(5.0)))
    assert correlation(np.arange(5.0), 2 * np.arange(5.0) + 1) == pytest.approx(1.0)


def test_standardised_within_each_class():
    values = np.array([1.0, 3.0, 10.0, 30.0, 5.0])
    labels = np.array([0, 0, 1, 1, 2])
    np.testing.assert_allclose(standardised(values, labels), [-1, 1, -1, 1, 0])


class BarClassifier:
    """Reads the class of a `drawn` bar from where it stands on its bottom row."""

    def logits_and_features(self, images):
        bottom = np.asarray(images)[:, BOTTOM] >= 0.5
        classes = (bottom.argmax(axis=1) - 4) // 2
        return np.eye(10)[classes], None


BOTTOM, TOP = 23, 8


def drawn(digit: int, shear: float, width: int) -> np.ndarray:
    """A bar from row TOP to BOTTOM standing at column 4 + 2 * digit, leaning `shear` px/row."""
    image = np.zeros((28, 28), np.float32)
    for row in range(TOP, BOTTOM + 1):
        left = 4 + 2 * digit + round(shear * (BOTTOM - row))
        image[row, left:left + width] = 1.0
    return image


class BarSampler:
    """Encodes a bar as z = (shear, width, its digit); decodes z with a label as a bar of that
    shear and width standing where `stand` says: "label" (a perfect swap), "source" (ignores
    the label), or keeps the label but draws a random shear ("random hand")."""

    latent_dim = noise_dim = 3
    classes = tuple(range(10))  # as `Sampler.classes`: MNIST's

    def __init__(self, stand: str):
        self.stand, self.rng = stand, np.random.default_rng(1)

    def encode(self, images, labels):
        ink = np.asarray(images) >= 128
        width = ink[:, BOTTOM].sum(axis=1)
        shear = (ink[:, TOP].argmax(axis=1) - ink[:, BOTTOM].argmax(axis=1)) / (BOTTOM - TOP)
        z = np.stack([shear, width, labels], axis=1).astype(np.float32)
        return z, np.zeros_like(z), np.zeros(len(z))

    def swap(self, z, source, target):  # no class transport: codes as they are
        return z

    def decode_codes(self, z, labels):
        if self.stand == "random hand":
            z = np.column_stack([self.rng.uniform(-0.2, 0.2, len(z)), z[:, 1:]])
        digits = z[:, 2] if self.stand == "source" else labels
        return np.stack([drawn(int(d), s, int(w)) for s, w, d in zip(z[:, 0], z[:, 1], digits)])

    def decode(self, noise, labels):  # prior draws: any shear, any width
        shear = np.clip(noise[:, 0] / 10, -0.2, 0.2)
        return np.stack([drawn(int(d), s, 1 + (n > 0)) for d, s, n in
                         zip(labels, shear, noise[:, 1])])


@pytest.fixture(scope="module")
def bars():
    rng = np.random.default_rng(0)
    digits = np.arange(200) % 10
    shears, widths = rng.integers(-3, 4, 200) / (BOTTOM - TOP), rng.integers(1, 3, 200)
    images = np.stack([drawn(d, s, w) for d, s, w in zip(digits, shears, widths)])
    return (images * 255).astype(np.uint8), digits


def test_a_perfect_swap_scores_full_accuracy_and_keeps_the_hand(bars):
    images, digits = bars
    result = scores(BarSampler("label"), BarClassifier(), images_u8=images, labels=digits)
    assert result["digits"] == 200 and result["swaps"] == 1800
    assert result["accuracy"] == 1.0 and result["target_met"]
    assert result["accuracy_per_target"] == [1.0] * 10
    pairs = np.array(result["accuracy_pairs"], dtype=float)
    assert np.all(np.isnan(np.diag(pairs)))  # a digit is never swapped to its own label
    for name in ("slant", "stroke_width"):
        style = result["style"][name]
        assert style["swap_r"] > 0.95 and style["reconstruction_r"] == pytest.approx(1.0)
        assert abs(style["prior_sample_r"]) < 0.2, (name, style)
    assert result["reconstruction_mse"] == 0.0
    assert summary_lines(result)[0].startswith("  label swap (200 digits x 9 labels): 1.0000")


def test_a_swap_that_ignores_the_label_scores_zero(bars):
    images, digits = bars
    result = scores(BarSampler("source"), BarClassifier(), images_u8=images, labels=digits)
    assert result["accuracy"] == 0.0 and not result["target_met"]
    assert result["worst_pair"]["accuracy"] == 0.0


def test_a_swap_in_another_hand_keeps_no_slant(bars):
    images, digits = bars
    style = scores(BarSampler("random hand"), BarClassifier(), images_u8=images,
                   labels=digits)["style"]
    assert abs(style["slant"]["swap_r"]) < 0.15 and style["stroke_width"]["swap_r"] > 0.9


def test_the_label_swap_is_scored_for_grey_digits_only_and_says_why_elsewhere():
    from shaped_data import shaped_spec

    from cvae.data.specs import FASHION_MNIST, MNIST

    assert omitted_because(MNIST) is None
    grey_digits_8x8 = dataclasses.replace(shaped_spec("digits8", 8, 8, 1, 10),
                                          class_names=MNIST.class_names)
    assert omitted_because(grey_digits_8x8) is None
    for spec in (FASHION_MNIST, shaped_spec("sprites", 32, 32, 3, 10),
                 dataclasses.replace(grey_digits_8x8, channels=3)):
        assert "slant and stroke width of handwritten digits" in omitted_because(spec)
