"""cvae/sampling/walks.py: latent walks made of `/sample`'s own latents, under the standard and
a mixture prior."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from cvae.config import presets
from cvae.sampling.walks import DigitWalk, LatentWalk, slerp, walk_latents
from cvae.model.registry import create_model, init_variables
from cvae.sampling.sampler import create_sampler
from cvae.sampling.latents import request_latents

LATENT = 6
DIGITS = tuple(range(10))  # the classes of the test config's dataset (MNIST)


class StandardPrior:
    """The sampler's side of a walk under N(0, I): codes are the draws themselves."""

    latent_dim = noise_dim = LATENT

    def to_codes(self, noise, labels):
        return noise

    def swap(self, z, source, target):
        return z


@pytest.fixture(scope="module")
def mixture_sampler():
    """A small untrained model whose mixture prior has moved away from N(0, I)."""
    config = presets.test().replace(prior="mixture", prior_components=3, latent_dim=LATENT)
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    mixture = dict(variables["prior"]["mixture"])
    mixture["means"] = jax.random.normal(jax.random.key(1), mixture["means"].shape) * 3
    variables = {**variables, "prior": {"mixture": mixture}}
    return create_sampler(model, config, variables)


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
    [(z, labels, _)] = walk_latents([LatentWalk(5, 9, (7, 2), 4, 0.8)], StandardPrior())
    assert z.shape == (8, LATENT) and labels.tolist() == [7] * 4 + [2] * 4
    for row, digit in enumerate((7, 2)):
        start, _ = request_latents(5, (digit,), 1, noise_width=LATENT, temperature=0.8)
        end, _ = request_latents(9, (digit,), 1, noise_width=LATENT, temperature=0.8)
        assert np.array_equal(z[4 * row], start[0]) and np.array_equal(z[4 * row + 3], end[0])


def test_digit_walk_keeps_each_sample_and_decodes_it_as_every_digit():
    [(z, labels, _)] = walk_latents([DigitWalk(3, 4, 2, 1.0, DIGITS)], StandardPrior())
    kept, _ = request_latents(3, (4,), 2, noise_width=LATENT, temperature=1.0)
    assert labels.tolist() == list(DIGITS) * 2
    assert np.array_equal(z, np.repeat(kept, 10, axis=0))


def test_walks_computed_together_equal_walks_computed_alone():
    walks = [LatentWalk(1, 2, DIGITS, 3, 1.0), DigitWalk(1, 0, 3, 0.5, DIGITS),
             LatentWalk(7, 1, (3,), 10, 1.5), DigitWalk(8, 9, 1, 1.0, (9, 2))]
    together = walk_latents(walks, StandardPrior())
    for walk, (z, labels, _) in zip(walks, together):
        [(alone_z, alone_labels, _)] = walk_latents([walk], StandardPrior())
        assert np.array_equal(z, alone_z) and np.array_equal(labels, alone_labels)
        assert len(z) == walk.rows


def test_under_a_mixture_prior_walks_are_made_of_the_codes_sample_decodes(mixture_sampler):
    noise, labels = request_latents(5, (7, 2), 1, noise_width=LATENT, temperature=1.0)
    codes = mixture_sampler.to_codes(noise, labels)
    assert not np.allclose(codes, noise)  # the prior moved them
    # Decoded as codes, they are the pictures /sample decodes from the noise.
    np.testing.assert_allclose(mixture_sampler.decode_codes(codes, labels),
                               mixture_sampler.decode(noise, labels), atol=1e-5)
    [walk] = walk_latents([LatentWalk(5, 9, (7, 2), 4, 1.0)], mixture_sampler)
    ends, _ = request_latents(9, (7, 2), 1, noise_width=LATENT, temperature=1.0)
    far = mixture_sampler.to_codes(ends, labels)
    for row in range(2):
        assert np.array_equal(walk.z[4 * row], codes[row])
        assert np.array_equal(walk.z[4 * row + 3], far[row])
    [kept] = walk_latents([DigitWalk(3, 4, 2, 1.0, mixture_sampler.classes)],
                          mixture_sampler)
    draws, draw_labels = request_latents(3, (4,), 2, noise_width=LATENT, temperature=1.0)
    codes = mixture_sampler.to_codes(draws, draw_labels)
    assert np.array_equal(kept.z[4::10], codes)  # the digit's own column: its code as it is
    # The other columns: carried to each digit's region (cvae/model/transport.py).
    np.testing.assert_allclose(kept.z[0::10], mixture_sampler.swap(codes, 4, np.zeros(2, int)))
    assert not np.allclose(kept.z[0::10], codes)


def test_codes_map_row_by_row_whatever_the_batch(mixture_sampler):
    noise = np.random.default_rng(0).standard_normal((300, LATENT)).astype(np.float32)
    labels = np.arange(300, dtype=np.int32) % 10
    together = mixture_sampler.to_codes(noise, labels)
    assert np.array_equal(together[:5], mixture_sampler.to_codes(noise[:5], labels[:5]))
