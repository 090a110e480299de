"""Learned priors: the density is a normalised mixture (checked against SciPy and on a grid), the
VampPrior's components are the encoder's posteriors at its pseudo-inputs, sampling maps one
noise vector to one z as cvae/model/prior.py does, and the learned mixture trains."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.stats import multivariate_normal

from cvae.config import presets
from cvae.model import learned_prior as lp
from cvae.model import prior as prior_lib
from cvae.model.registry import create_model, init_variables

LOG_WEIGHTS = np.log(np.array([[0.2, 0.8], [0.5, 0.5]]))  # 2 classes x 2 components, L = 2
MEANS = np.array([[[-2.0, 0.0], [1.0, 1.0]], [[0.0, 3.0], [0.5, -1.0]]])
LOGVARS = np.array([[[0.0, -1.0], [0.5, 0.2]], [[-0.5, -0.5], [1.0, 0.0]]])
MIXTURE = tuple(jnp.asarray(a, jnp.float32) for a in (LOG_WEIGHTS, MEANS, LOGVARS))


def scipy_density(z: np.ndarray, label: int) -> np.ndarray:
    return sum(np.exp(LOG_WEIGHTS[label, k]) * multivariate_normal.pdf(
        z, MEANS[label, k], np.diag(np.exp(LOGVARS[label, k]))) for k in range(2))


def test_log_density_is_the_mixture_scipy_computes():
    z = np.random.default_rng(0).normal(0, 2, (50, 2))
    labels = np.arange(50) % 2
    ours = lp.diagonal_log_density(MIXTURE, jnp.asarray(z, jnp.float32), jnp.asarray(labels))
    expected = [math.log(scipy_density(row, label)) for row, label in zip(z, labels)]
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_log_density_broadcasts_over_importance_samples():
    z = jax.random.normal(jax.random.key(0), (3, 4, 2))
    labels = jnp.array([0, 1, 1, 0])
    stacked = lp.diagonal_log_density(MIXTURE, z, labels)
    assert stacked.shape == (3, 4)
    np.testing.assert_allclose(stacked[1], lp.diagonal_log_density(MIXTURE, z[1], labels),
                               rtol=1e-6)


@pytest.mark.parametrize("label", [0, 1])
def test_density_integrates_to_one(label):
    axis = np.linspace(-12, 12, 481)
    grid = np.stack(np.meshgrid(axis, axis), -1).reshape(-1, 2)
    density = np.exp(lp.diagonal_log_density(MIXTURE, jnp.asarray(grid, jnp.float32),
                                             jnp.full(len(grid), label)))
    assert float(density.sum() * (axis[1] - axis[0]) ** 2) == pytest.approx(1.0, abs=1e-3)


def test_as_mixture_gives_the_fitted_priors_format_and_density():
    mixture = lp.as_mixture(MIXTURE)
    assert mixture["scale_tril"].shape == (2, 2, 2, 2)
    z = jax.random.normal(jax.random.key(1), (20, 2))
    labels = jnp.arange(20) % 2
    np.testing.assert_allclose(prior_lib.log_density(mixture, z, labels),
                               lp.diagonal_log_density(MIXTURE, z, labels), rtol=1e-5)


def test_sampling_is_one_noise_vector_to_one_z_by_the_fitted_priors_rule():
    noise = jax.random.normal(jax.random.key(2), (1000, 2))
    labels = jnp.arange(1000) % 2
    z = lp.sample(MIXTURE, noise, labels)
    np.testing.assert_array_equal(z, lp.sample(MIXTURE, noise, labels))  # deterministic
    np.testing.assert_array_equal(z[:10], lp.sample(MIXTURE, noise[:10], labels[:10]))
    # The component is read from frac(1000 * noise[0]), then z = mean + sigma * noise.
    uniform = np.mod(np.asarray(noise[:, 0]) * 1000.0, 1.0)
    weights = np.exp(LOG_WEIGHTS)[np.asarray(labels)]
    component = (uniform >= weights[:, 0]).astype(int)
    expected = (MEANS[np.asarray(labels), component]
                + np.exp(0.5 * LOGVARS[np.asarray(labels), component]) * np.asarray(noise))
    np.testing.assert_allclose(z, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.4])
def test_components_are_drawn_by_weight_at_any_temperature(temperature):
    far = (MIXTURE[0], jnp.asarray([[[-50.0, 0.0], [50.0, 0.0]]] * 2), MIXTURE[2])
    noise = temperature * jax.random.normal(jax.random.key(3), (20000, 2))
    z = lp.sample(far, noise, jnp.zeros(20000, jnp.int32))
    assert float(jnp.mean(z[:, 0] > 0)) == pytest.approx(0.8, abs=0.015)


def test_pseudo_inputs_are_pixels_near_the_papers_start():
    module = lp.PseudoInputs(per_class=3, pixels=16, num_classes=10)
    variables = module.init(jax.random.key(4))
    u = module.apply(variables)
    assert u.shape == (10, 3, 16)
    assert float(u.min()) > 0 and float(u.max()) < 1
    assert float(u.mean()) == pytest.approx(lp.PSEUDO_INPUT_MEAN, abs=0.005)


def test_vamp_components_are_the_encoders_posteriors_at_the_pseudo_inputs():
    def encode_fn(images, labels):  # a stand-in encoder that shows what it was given
        return images[:, :2] + labels[:, None], images[:, 2:4] - labels[:, None]

    u = jnp.asarray(np.random.default_rng(1).uniform(size=(10, 3, 5)), jnp.float32)
    log_weights, means, logvars = lp.vamp_components(encode_fn, u)
    np.testing.assert_allclose(np.exp(log_weights), 1 / 3, rtol=1e-6)
    label = np.arange(10)[:, None, None]
    np.testing.assert_allclose(means, u[..., :2] + label, rtol=1e-6)
    np.testing.assert_allclose(logvars, u[..., 2:4] - label, rtol=1e-6)


def test_vamp_prior_of_a_cvae_has_a_finite_density_and_trains_its_pseudo_inputs():
    config = presets.test()
    model = create_model(config)
    variables = init_variables(model, jax.random.key(5))
    pseudo = lp.PseudoInputs(per_class=2, pixels=784, num_classes=10)
    pseudo_variables = pseudo.init(jax.random.key(6))
    z = jax.random.normal(jax.random.key(7), (8, config.model.options.latent_dim))
    labels = jnp.arange(8) % 10

    def log_prior(pseudo_params):
        u = pseudo.apply({"params": pseudo_params})
        mixture = lp.vamp_components(
            lambda x, y: model.apply(variables, x, y, method="encode"), u)
        return lp.diagonal_log_density(mixture, z, labels).sum()

    value, grads = jax.jit(jax.value_and_grad(log_prior))(pseudo_variables["params"])
    assert np.isfinite(float(value))
    assert float(jnp.abs(grads["logits"]).max()) > 0


def test_learned_mixture_recovers_a_known_mixture_by_gradient_ascent():
    rng = np.random.default_rng(2)
    component = rng.random(4000) < 0.3
    data = np.where(component[:, None], rng.normal(-3.0, 0.5, (4000, 1)),
                    rng.normal(2.0, 1.0, (4000, 1))).astype(np.float32)
    module = lp.GaussianMixturePrior(components=2, latent_dim=1, num_classes=1)
    params = module.init(jax.random.key(8))["params"]
    params = {**params, "means": jnp.array([[[-1.0], [1.0]]])}  # distinct starts
    tx = optax.adam(0.05)
    state = tx.init(params)
    labels = jnp.zeros(4000, jnp.int32)

    @jax.jit
    def step(params, state):
        loss, grads = jax.value_and_grad(lambda p: -lp.diagonal_log_density(
            module.apply({"params": p}), jnp.asarray(data), labels).mean())(params)
        updates, state = tx.update(grads, state)
        return optax.apply_updates(params, updates), state

    for _ in range(400):
        params, state = step(params, state)
    log_weights, means, logvars = module.apply({"params": params})
    np.testing.assert_allclose(np.exp(log_weights[0]), [0.3, 0.7], atol=0.03)
    np.testing.assert_allclose(means[0, :, 0], [-3.0, 2.0], atol=0.1)
    np.testing.assert_allclose(np.exp(0.5 * logvars[0, :, 0]), [0.5, 1.0], atol=0.08)
