"""The discretised logistic mixture (PixelCNN++'s, `cvae.model.likelihoods.LogisticMixture`):
a density over the 256 levels of each pixel, its colour channels coupled."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae.config import presets
from cvae.config.sections import Config
from cvae.model import densities
from cvae.model.likelihoods import LogisticMixture, MixtureOptions

LEVELS = jnp.arange(256, dtype=jnp.float32) / 255.0


def mixture_section(components: int):
    return Config().replace(likelihood="logistic_mixture",
                            mixture_components=components).likelihood


def test_one_component_of_one_channel_is_the_single_logistic():
    outputs = jax.random.normal(jax.random.key(0), (4, 3 * 5))  # 5 locations: logit, mean, scale
    per_location = outputs.reshape(4, 5, 3)
    targets = jax.random.randint(jax.random.key(1), (4, 5), 0, 256) / 255.0
    single = jnp.concatenate([per_location[..., 1], per_location[..., 2]], axis=-1)
    np.testing.assert_allclose(
        densities.reconstruction(outputs, targets, mixture_section(1)),
        densities.reconstruction(single, targets, "logistic"), rtol=1e-6)


def test_each_grey_pixel_is_a_distribution_over_the_levels():
    options = MixtureOptions(mixture_components=3)
    outputs = jax.random.normal(jax.random.key(2), (3 * 3,)) * 2.0  # one location
    nll = jax.vmap(lambda level: LogisticMixture.negative_log_likelihood(
        outputs, level[None], options=options, channels=1))(LEVELS)
    assert float(jnp.exp(-nll).sum()) == pytest.approx(1.0, abs=1e-5)


def test_each_colour_pixel_is_a_distribution_over_the_level_cube():
    """One component's coupled density is p(r) p(g|r) p(b|r,g): for a red level, the masses of
    all 65,536 (green, blue) pairs sum to p(r), red's own logistic mass; the red masses sum to
    1 (the grey test), so the cube does, and so does a mixture of such components."""
    options = MixtureOptions(mixture_components=1)
    outputs = jax.random.normal(jax.random.key(3), (1 + 6 + 3,))
    green, blue = (grid.ravel() for grid in jnp.meshgrid(LEVELS, LEVELS, indexing="ij"))
    for red in (0.0, 0.3, 1.0):
        colours = jnp.stack([jnp.full_like(green, red), green, blue], -1)
        masses = jnp.exp(-jax.vmap(lambda colour: LogisticMixture.negative_log_likelihood(
            outputs, colour, options=options, channels=3))(colours))
        red_mass = jnp.exp(densities.discretized_logistic_log_mass(
            jnp.float32(red), outputs[1], jnp.maximum(outputs[4], densities._MIN_LOG_SCALE)))
        assert float(masses.sum()) == pytest.approx(float(red_mass), rel=1e-4, abs=1e-7)


def test_the_coupling_moves_green_with_red():
    """With a coupling, the likeliest green level follows the red value it is scored with."""
    options = MixtureOptions(mixture_components=1)
    # one location: logit, means (r, g, b), log-scales, couplings (alpha, beta, gamma)
    outputs = jnp.array([0.0, 0.2, 0.2, 0.2, -4.0, -4.0, -4.0, 3.0, 0.0, 0.0])
    alpha = float(jnp.tanh(3.0))

    def best_green(red):
        scores = jax.vmap(lambda g: LogisticMixture.negative_log_likelihood(
            outputs, jnp.array([red, g, 0.2]), options=options, channels=3))(LEVELS)
        return float(LEVELS[jnp.argmin(scores)])

    assert best_green(0.0) == pytest.approx(0.2, abs=1 / 255)
    assert best_green(0.5) == pytest.approx(0.2 + alpha * 0.5, abs=1 / 255)


def test_sharpness_renders_the_mean_at_1_and_leans_to_the_likeliest_component_above():
    """Two grey components at 0.2 (weight 0.7) and 0.9 (weight 0.3): sharpness 1 renders the
    mixture's mean, 0.41; sharpness s weighs them 0.7^s : 0.3^s, so 10 renders nearly 0.2."""
    options = MixtureOptions(mixture_components=2)
    logits = jnp.log(jnp.array([0.7, 0.3]))
    means = jnp.array([0.2, 0.9])
    outputs = jnp.concatenate([logits, means, jnp.array([-3.0, -3.0])])  # one location

    def rendered(sharpness):
        return float(LogisticMixture.means(outputs, sharpness, options=options, channels=1)[0])

    assert rendered(1.0) == pytest.approx(0.7 * 0.2 + 0.3 * 0.9, abs=1e-6)
    weights = jnp.array([0.7, 0.3]) ** 10
    assert rendered(10.0) == pytest.approx(float((weights * means).sum() / weights.sum()),
                                           abs=1e-6)
    assert rendered(10.0) < 0.21


@pytest.mark.slow  # a variant's journey end to end: `make test-slow`
def test_a_model_trains_on_it_and_renders_pixels(tmp_path):
    from cvae.data.synthetic import synthetic_dataset
    from cvae.sampling.sampler import load_sampler
    from cvae.training.callbacks import Checkpointer
    from cvae.training.loop import train_and_evaluate

    config = presets.test().replace(likelihood="logistic_mixture", mixture_components=2,
                                    max_steps=8)
    train_and_evaluate(config, synthetic_dataset(64, 16), tmp_path, callbacks=[Checkpointer()])
    sampler = load_sampler(tmp_path)
    assert sampler.config.likelihood.options.mixture_components == 2
    images = np.asarray(sampler.sample_images(3, 4, 0))
    assert images.shape == (4, 28, 28) and 0 <= images.min() and images.max() <= 1
