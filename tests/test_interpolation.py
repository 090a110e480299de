"""cvae/interpolation.py: latent walks made of `/sample`'s own latents."""

from __future__ import annotations

import numpy as np

from cvae.interpolation import DigitWalk, LatentWalk, slerp, walk_latents
from cvae.sampling import DIGITS, request_latents

LATENT = 6


def test_slerp_ends_exactly_at_its_ends_and_keeps_equal_angles():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, LATENT)).astype(np.float32)
    path = slerp(a, b, 9)
    assert path.dtype == np.float32 and path.shape == (9, LATENT)
    assert np.array_equal(path[0], a) and np.array_equal(path[-1], b)
    unit = path / np.linalg.norm(path, axis=1, keepdims=True)
    angles = np.arccos(np.clip(np.sum(unit[1:] * unit[:-1], axis=1), -1, 1))
    np.testing.assert_allclose(angles, angles[0], rtol=1e-4)
    # The length goes linearly; a straight line's middle would shrink towards the origin.
    norms = np.linalg.norm(path, axis=1)
    np.testing.assert_allclose(norms, np.linspace(norms[0], norms[-1], 9), rtol=1e-5)
    assert norms[4] > np.linalg.norm((a + b) / 2)


def test_slerp_of_parallel_vectors_is_the_straight_line():
    a = np.ones(LATENT, np.float32)
    np.testing.assert_allclose(slerp(a, 3 * a, 3)[1], 2 * a, rtol=1e-6)


def test_latent_walk_rows_run_from_the_seed_sample_to_the_to_seed_sample():
    [(z, labels)] = walk_latents([LatentWalk(5, 9, (7, 2), 4, 0.8)], LATENT)
    assert z.shape == (8, LATENT) and labels.tolist() == [7] * 4 + [2] * 4
    for row, digit in enumerate((7, 2)):
        start, _ = request_latents(5, (digit,), 1, LATENT, 0.8)
        end, _ = request_latents(9, (digit,), 1, LATENT, 0.8)
        assert np.array_equal(z[4 * row], start[0]) and np.array_equal(z[4 * row + 3], end[0])


def test_digit_walk_keeps_each_sample_and_decodes_it_as_every_digit():
    [(z, labels)] = walk_latents([DigitWalk(3, 4, 2, 1.0)], LATENT)
    kept, _ = request_latents(3, (4,), 2, LATENT, 1.0)
    assert labels.tolist() == list(DIGITS) * 2
    assert np.array_equal(z, np.repeat(kept, 10, axis=0))


def test_walks_computed_together_equal_walks_computed_alone():
    walks = [LatentWalk(1, 2, DIGITS, 3, 1.0), DigitWalk(1, 0, 3, 0.5),
             LatentWalk(7, 1, (3,), 10, 1.5), DigitWalk(8, 9, 1, 1.0)]
    together = walk_latents(walks, LATENT)
    for walk, (z, labels) in zip(walks, together):
        [(alone_z, alone_labels)] = walk_latents([walk], LATENT)
        assert np.array_equal(z, alone_z) and np.array_equal(labels, alone_labels)
        assert len(z) == walk.rows
