"""The sampler's truncation: a noise vector longer than N(0, I)'s q-quantile radius is pulled in
onto it, after its mixture component is chosen; a shorter one is drawn as before, bit for bit,
through every prior and the ladder."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae import presets
from cvae.model import prior
from cvae.model.networks import create_model, init_variables
from cvae.sampling.sampler import create_sampler


def test_the_radius_holds_its_quantile_and_only_longer_rows_move():
    noise = np.random.default_rng(0).normal(size=(200_000, 16)).astype(np.float32)
    radius = prior.truncation_radius(0.7, 16)
    length = np.linalg.norm(noise, axis=1)
    assert np.mean(length <= radius) == pytest.approx(0.7, abs=0.005)
    out = np.asarray(jax.jit(prior.truncate, static_argnums=1)(noise, radius))
    inside = length <= radius
    assert np.array_equal(out[inside].view(np.uint32), noise[inside].view(np.uint32))
    np.testing.assert_allclose(np.linalg.norm(out[~inside], axis=1), radius, rtol=1e-5)
    cosine = np.sum(out[~inside] * noise[~inside], axis=1) / (radius * length[~inside])
    np.testing.assert_allclose(cosine, 1.0, rtol=1e-5)  # the same direction, shorter
    assert prior.truncation_radius(1.0, 16) is None
    assert prior.truncate(noise, None) is noise


def test_a_truncated_draw_keeps_its_component():
    """Components 100 apart, so each z says which one drew it."""
    classes, components, width = 10, 4, 3
    mixture = {"weights": jnp.full((classes, components), 1.0 / components),
               "means": jnp.broadcast_to(100.0 * jnp.arange(components)[:, None],
                                         (classes, components, width)),
               "scale_tril": jnp.broadcast_to(jnp.eye(width), (classes, components, width, width))}
    noise = jax.random.normal(jax.random.key(0), (5000, width)) * 2.0
    labels = jnp.arange(5000) % classes
    radius = prior.truncation_radius(0.5, width)
    plain = prior.sample(mixture, noise, labels)
    cut = prior.sample(mixture, noise, labels, radius=radius)
    np.testing.assert_array_equal(np.round(plain / 100)[:, 0], np.round(cut / 100)[:, 0])
    offset = np.asarray(cut) - 100.0 * np.round(np.asarray(cut) / 100)
    assert np.all(np.linalg.norm(offset, axis=1) <= radius * (1 + 1e-4))
    inside = np.linalg.norm(np.asarray(noise), axis=1) <= radius
    assert 0 < inside.sum() < len(inside)
    np.testing.assert_allclose(offset[inside], np.asarray(noise)[inside], atol=1e-4)


@pytest.mark.parametrize("changes", [
    {"prior": "standard"},
    {"prior": "mixture", "prior_components": 3},
    {"prior": "mixture", "prior_components": 2, "stochastic_layers": 2, "upper_latent_dim": 3},
], ids=["standard", "mixture", "ladder"])
def test_the_sampler_draws_short_noise_as_before_and_pulls_in_the_rest(changes):
    config = presets.test().replace(**changes)
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    plain = create_sampler(model, config, variables, block_rows=64)
    cut = create_sampler(create_model(config.replace(truncation=0.5)),
                         config.replace(truncation=0.5), variables, block_rows=64)
    noise = np.asarray(jax.random.normal(jax.random.key(1), (64, plain.noise_dim)))
    labels = np.arange(64, dtype=np.int32) % 10
    top = noise[:, :plain.latent_dim]  # the share the prior maps (the ladder's top layer)
    inside = np.linalg.norm(top, axis=1) <= prior.truncation_radius(0.5, plain.latent_dim)
    assert 10 < inside.sum() < 54
    same = np.array_equal  # bit for bit, row by row
    plain_images, cut_images = plain.decode(noise, labels), cut.decode(noise, labels)
    assert all(same(plain_images[i], cut_images[i]) for i in np.flatnonzero(inside))
    assert not any(same(plain_images[i], cut_images[i]) for i in np.flatnonzero(~inside))
    codes = cut.to_codes(noise, labels)
    assert all(same(plain.to_codes(noise, labels)[i], codes[i]) for i in np.flatnonzero(inside))
