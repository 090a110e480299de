"""IWAE bounds on a tiny random model: K=1 is the ELBO, chunking changes nothing, K tightens."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae import config as config_lib
from cvae.evaluation import iwae
from cvae.model.losses import reconstruction
from cvae.model.networks import create_model, init_variables, reparameterize
from cvae.data.synthetic import synthetic_images


@pytest.fixture(scope="module")
def tiny():
    config = config_lib.test()
    model = create_model(config)
    variables = init_variables(model, jax.random.key(1))
    labels = np.arange(32, dtype=np.int32) % 10
    images_u8 = synthetic_images(labels).reshape(-1, 784)
    x = iwae.binarize_levels(jax.random.key(2), jnp.asarray(images_u8))
    return model, variables, x, jnp.asarray(labels), images_u8, labels


def test_k1_equals_single_sample_elbo(tiny):
    model, variables, x, y, _, _ = tiny
    key = jax.random.key(3)
    bound = iwae.create_iwae_fn(model, "bernoulli", 1)(variables, x, y, key)
    # The model's own forward pass with the key of sample 0 draws the same z.
    z_key = jax.random.fold_in(key, 0)
    logits, mean, logvar = model.apply(variables, x, y, z_key)
    z = reparameterize(z_key, mean, logvar)
    log_q = iwae.gaussian_log_density(z, mean, logvar)
    log_p = iwae.gaussian_log_density(z, 0.0, jnp.zeros_like(z))
    elbo = -reconstruction(logits, x, "bernoulli") + log_p - log_q
    np.testing.assert_allclose(bound, elbo, rtol=1e-5, atol=1e-4)


def test_chunked_and_unchunked_agree(tiny):
    model, variables, x, y, _, _ = tiny
    key = jax.random.key(4)
    whole = iwae.create_iwae_fn(model, "bernoulli", 24, chunk=24)(variables, x, y, key)
    for chunk in (8, 7):  # 7 does not divide 24: the padded samples must weigh nothing
        chunked = iwae.create_iwae_fn(model, "bernoulli", 24, chunk=chunk)(variables, x, y, key)
        np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-4)


def test_bound_tightens_as_k_grows(tiny):
    model, variables, x, y, _, _ = tiny
    key = jax.random.key(5)
    means = [float(iwae.create_iwae_fn(model, "bernoulli", k, chunk=50)(variables, x, y, key)
                   .mean()) for k in (1, 10, 100, 500)]
    assert all(b >= a - 1e-4 for a, b in zip(means, means[1:])), means
    assert means[-1] > means[0]


def test_marginal_is_logsumexp_over_labels_with_uniform_prior():
    table = np.log(np.full((2, 10), 0.5))
    np.testing.assert_allclose(iwae.marginal_log_likelihood(table), np.log(0.5))
    table = np.full((1, 10), -np.inf)
    table[0, 3] = -80.0
    np.testing.assert_allclose(iwae.marginal_log_likelihood(table), -80.0 - math.log(10))


def test_test_set_bounds_pass_the_marginal_check(tiny):
    model, variables, _, _, images_u8, labels = tiny
    bounds = iwae.test_set_bounds(model, variables, images_u8=images_u8, labels=labels,
                                  key=jax.random.key(6),
                                  num_samples=8, marginal_samples=2, batch_size=12, chunk=4)
    assert bounds["log_px_given_label"].shape == (32, 10)
    assert np.all(np.isfinite(bounds["log_px"]))
    check = iwae.check_marginal(bounds["log_px_given_y"], bounds["log_px_given_label"],
                                bounds["log_px"])
    assert check["ok"], check
    # The check catches a wrong marginal.
    assert not iwae.check_marginal(bounds["log_px_given_y"], bounds["log_px_given_label"],
                                   bounds["log_px"] - 5 * math.log(10))["ok"]
