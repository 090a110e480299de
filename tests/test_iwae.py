"""IWAE bounds on a tiny random model: K=1 is the ELBO, chunking changes nothing, K tightens."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae import presets
from cvae.evaluation import iwae
from cvae.model.losses import reconstruction
from cvae.model.networks import create_model, init_variables, reparameterize
from cvae.data.synthetic import synthetic_images


@pytest.fixture(scope="module")
def tiny():
    config = presets.test()
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


def test_the_ten_label_table_is_ten_single_label_bounds_with_common_draws(tiny):
    model, variables, x, _, _, _ = tiny
    key = jax.random.key(7)
    table = iwae.create_label_table_fn(model, "bernoulli", 6, chunk=4)(variables, x, key)
    single = iwae.create_iwae_fn(model, "bernoulli", 6, chunk=6)
    for label in range(10):
        alone = single(variables, x, jnp.full((32,), label, jnp.int32), key)
        np.testing.assert_allclose(table[:, label], alone, rtol=1e-5, atol=1e-4)


def test_bayes_rule_error_reads_the_argmax():
    bounds = np.full((4, 10), -100.0)
    bounds[[0, 1, 2, 3], [3, 5, 5, 0]] = -90.0
    result = iwae.bayes_rule_error(bounds, np.array([3, 5, 1, 0]))
    assert result["error"] == 0.25
    assert result["error_per_digit"][1] == 1.0 and result["error_per_digit"][2] is None


@pytest.fixture(scope="module")
def tiny_ladder(tiny):
    from cvae.model import hierarchical as hv

    model = hv.LadderCVAE(latent_dims=(4, 3), hidden_sizes=(32, 16), upper_width=8,
                          activation="tanh")
    variables = hv.init_ladder(model, jax.random.key(8))
    _, _, x, y, images_u8, labels = tiny
    return model, variables, x, y, images_u8, labels


def test_ladder_log_weights_are_its_own_densities_over_every_layer(tiny_ladder):
    from cvae.model import hierarchical as hv

    model, variables, x, y, _, _ = tiny_ladder
    key = jax.random.key(9)
    bound = iwae.create_iwae_fn(model, "bernoulli", 1)(variables, x, y, key)
    noise = iwae.sample_noise(key, 0, (32, model.total_dim))
    out = model.apply(variables, x, y, noise)
    elbo = -reconstruction(out.logits, x, "bernoulli") + hv.log_p(out, y) - hv.log_q(out)
    np.testing.assert_allclose(bound, elbo, rtol=1e-5, atol=1e-4)
    whole = iwae.create_iwae_fn(model, "bernoulli", 12, chunk=12)(variables, x, y, key)
    chunked = iwae.create_iwae_fn(model, "bernoulli", 12, chunk=5)(variables, x, y, key)
    np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-4)
    assert float(whole.mean()) > float(bound.mean())


def test_a_learned_prior_in_the_prior_collection_is_the_top_layers_density(tiny_ladder):
    from cvae.model import hierarchical as hv
    from cvae.model import learned_prior

    model, variables, x, y, _, _ = tiny_ladder
    mixture = learned_prior.GaussianMixturePrior(components=3, latent_dim=3).apply(
        learned_prior.GaussianMixturePrior(components=3, latent_dim=3).init(jax.random.key(10)))
    with_prior = {**variables, "prior": {"mixture": learned_prior.as_mixture(mixture)}}
    key = jax.random.key(11)
    noise = jax.vmap(lambda k: iwae.sample_noise(key, k, (32, model.total_dim)))(jnp.arange(2))
    ours = iwae.log_weights_fn(model, with_prior, "bernoulli")(x, y, noise)
    out = model.apply(variables, x, y, noise)
    expected = (-reconstruction(out.logits, jnp.broadcast_to(x, out.logits.shape), "bernoulli")
                + hv.log_p(out, y, lambda z, labels: learned_prior.diagonal_log_density(
                    mixture, z, labels)) - hv.log_q(out))
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-3)


def test_ladder_test_set_bounds_pass_the_marginal_check(tiny_ladder):
    model, variables, _, _, images_u8, labels = tiny_ladder
    bounds = iwae.test_set_bounds(model, variables, images_u8=images_u8, labels=labels,
                                  key=jax.random.key(12),
                                  num_samples=4, marginal_samples=2, batch_size=12, chunk=4)
    assert bounds["label_bounds"].shape == (32, 10)
    check = iwae.check_marginal(bounds["log_px_given_y"], bounds["log_px_given_label"],
                                bounds["log_px"])
    assert check["ok"], check
