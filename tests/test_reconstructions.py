"""Reconstructions scored like samples: a perfect autoencoder scores exactly as the real even
half does, the reconstructions go through the sampler's encode and code decode with the own
label, and the samples' FD is put against theirs."""

from __future__ import annotations

import numpy as np
import pytest

from cvae.data.synthetic import synthetic_images
from cvae.evaluation import fidelity, reconstructions


class IdentitySampler:
    """Encodes a digit as its own pixels and decodes them back: a perfect autoencoder, which
    records the labels it was given."""

    def __init__(self):
        self.labels = []

    def encode(self, images_u8, labels):
        self.labels.append(("encode", np.asarray(labels)))
        flat = np.asarray(images_u8, np.float32).reshape(len(images_u8), -1) / np.float32(255)
        return flat, np.zeros_like(flat), np.zeros(len(flat), np.float32)

    def decode_codes(self, codes, labels):
        self.labels.append(("decode", np.asarray(labels)))
        return np.asarray(codes).reshape(-1, 28, 28)


class PixelClassifier:
    """Features: every 49th pixel; logits: which band of rows is brightest (what the synthetic
    digits encode their label in)."""

    def logits_and_features(self, images):
        images = fidelity._as_float(images)
        bands = np.stack([images[:, 2 * d + 4:2 * d + 8].mean(axis=(1, 2)) for d in range(10)],
                         axis=1)
        return bands, images.reshape(len(images), -1)[:, ::49].astype(np.float64)


@pytest.fixture(scope="module")
def digits():
    labels = np.arange(200) % 10
    return synthetic_images(labels, seed=3), labels


def test_a_perfect_autoencoder_scores_as_the_real_even_half(digits):
    images, labels = digits
    sampler = IdentitySampler()
    result = reconstructions.scores(sampler, PixelClassifier(), images_u8=images, labels=labels)
    real = fidelity.reference_scores(PixelClassifier(), images, labels)
    for name in ("fd", "precision", "recall", "coverage"):
        assert result[name] == pytest.approx(real[name], rel=1e-9, abs=1e-12), name
    assert result["accuracy"] == 1.0 and result["digits"] == 100
    # Encoded and decoded with each digit's own label, the even half only.
    assert [step for step, _ in sampler.labels] == ["encode", "decode"]
    for _, given in sampler.labels:
        np.testing.assert_array_equal(given, labels[0::2])


def test_the_samples_fd_is_put_against_the_reconstructions(digits):
    images, labels = digits
    result = reconstructions.scores(IdentitySampler(), PixelClassifier(), images_u8=images,
                                    labels=labels,
                                    samples_fd=3 * 0.5)
    assert result["fd_ratio"] == pytest.approx(1.5 / result["fd"])
    line = reconstructions.summary_line(result)
    assert line.startswith("  reconstructions (100 test digits)") and "samples' FD" in line
