"""IWAE bounds on tiny random models, the one-latent CVAE and the ladder: K=1 is the ELBO under
the sampling prior, chunking changes nothing, K tightens, the label table is every label's bound
with common draws, and the marginal and its check count the classes of the model's dataset."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae.config import presets
from cvae.data.synthetic import synthetic_images
from cvae.evaluation import iwae
from cvae.model import densities, learned_prior
from cvae.model import prior as prior_lib
from cvae.model.registry import create_model, init_variables
from jitted import apply


log_weights = jax.jit(iwae.log_weights, static_argnames="model")  # as apply


@pytest.fixture(scope="module")
def tiny():
    config = presets.test()
    model = create_model(config)
    variables = init_variables(model, jax.random.key(1))
    labels = np.arange(32, dtype=np.int32) % 10
    images_u8 = synthetic_images(labels).reshape(-1, model.data.pixels)
    x = iwae.binarize_levels(jax.random.key(2), jnp.asarray(images_u8))
    return model, variables, x, jnp.asarray(labels), images_u8, labels


def test_k1_equals_single_sample_elbo(tiny):
    model, variables, x, y, _, _ = tiny
    key = jax.random.key(3)
    bound = iwae.create_iwae_fn(model, 1)(variables, x, y, key)
    # Sample 0's noise, through the posterior, scored by hand under the standard prior.
    noise = iwae.sample_noise(key, 0, (32, model.noise_dim))
    mean, logvar = apply(model, variables, x, y, method="encode")
    z = mean + jnp.exp(0.5 * logvar) * noise
    logits = apply(model, variables, z, y, method="decode")
    elbo = (-densities.reconstruction(logits, x, "bernoulli") + densities.standard_log_density(z)
            - densities.gaussian_log_density(z, mean, logvar))
    np.testing.assert_allclose(bound, elbo, rtol=1e-5, atol=1e-4)


def test_chunked_and_unchunked_agree(tiny):
    model, variables, x, y, _, _ = tiny
    key = jax.random.key(4)
    whole = iwae.create_iwae_fn(model, 24, chunk=24)(variables, x, y, key)
    for chunk in (8, 7):  # 7 does not divide 24: the padded samples must weigh nothing
        chunked = iwae.create_iwae_fn(model, 24, chunk=chunk)(variables, x, y, key)
        np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-4)


def test_bound_tightens_as_k_grows(tiny):
    model, variables, x, y, _, _ = tiny
    key = jax.random.key(5)
    means = [float(iwae.create_iwae_fn(model, k, chunk=50)(variables, x, y, key).mean())
             for k in (1, 10, 100, 500)]
    assert all(b >= a - 1e-4 for a, b in zip(means, means[1:])), means
    assert means[-1] > means[0]


def test_marginal_is_logsumexp_over_labels_with_uniform_prior():
    table = np.log(np.full((2, 10), 0.5))
    np.testing.assert_allclose(iwae.marginal_log_likelihood(table), np.log(0.5))
    table = np.full((1, 10), -np.inf)
    table[0, 3] = -80.0
    np.testing.assert_allclose(iwae.marginal_log_likelihood(table), -80.0 - math.log(10))
    # The label prior is uniform over the table's columns: a dataset of 3 classes gives 1/3.
    three = np.full((1, 3), -np.inf)
    three[0, 1] = -80.0
    np.testing.assert_allclose(iwae.marginal_log_likelihood(three), -80.0 - math.log(3))


def test_marginal_check_counts_the_tables_classes():
    """With C columns the upper bound is -log p(x|y) + log C, not + log 10."""
    table = np.array([[-100.0, -1e9, -1e9]])
    log_px = iwae.marginal_log_likelihood(table)  # -100 - log 3
    assert iwae.check_marginal(table[:, 0], table, log_px)["ok"]
    assert not iwae.check_marginal(table[:, 0], table, log_px - (math.log(10) - math.log(3)))["ok"]


def test_test_set_bounds_pass_the_marginal_check(tiny):
    model, variables, _, _, images_u8, labels = tiny
    bounds = iwae.test_set_bounds(model, variables, images_u8=images_u8, labels=labels,
                                  key=jax.random.key(6),
                                  num_samples=8, marginal_samples=2, batch_size=12, chunk=4)
    assert bounds["log_px_given_label"].shape == (32, model.num_classes)
    assert np.all(np.isfinite(bounds["log_px"]))
    check = iwae.check_marginal(bounds["log_px_given_y"], bounds["log_px_given_label"],
                                bounds["log_px"])
    assert check["ok"], check
    # The check catches a wrong marginal.
    assert not iwae.check_marginal(bounds["log_px_given_y"], bounds["log_px_given_label"],
                                   bounds["log_px"] - 5 * math.log(10))["ok"]


def test_the_label_table_is_one_single_label_bound_a_class_with_common_draws(tiny):
    model, variables, x, _, _, _ = tiny
    key = jax.random.key(7)
    table = iwae.create_label_table_fn(model, 6, chunk=4)(variables, x, key)
    assert table.shape == (32, model.num_classes)
    single = iwae.create_iwae_fn(model, 6, chunk=6)
    for label in range(model.num_classes):
        alone = single(variables, x, jnp.full((32,), label, jnp.int32), key)
        np.testing.assert_allclose(table[:, label], alone, rtol=1e-5, atol=1e-4)


def test_bayes_rule_error_reads_the_argmax():
    bounds = np.full((4, 10), -100.0)
    bounds[[0, 1, 2, 3], [3, 5, 5, 0]] = -90.0
    result = iwae.bayes_rule_error(bounds, np.array([3, 5, 1, 0]))
    assert result["error"] == 0.25
    assert result["error_per_digit"][1] == 1.0 and result["error_per_digit"][2] is None
    assert len(result["error_per_digit"]) == 10
    assert len(iwae.bayes_rule_error(bounds[:, :4], np.array([3, 1, 1, 0]))["error_per_digit"]) == 4


@pytest.fixture(scope="module")
def tiny_ladder(tiny):
    config = presets.test().replace(model="ladder", stochastic_layers=2, upper_latent_dim=3,
                                    prior="mixture", prior_components=3, activation="tanh")
    model = create_model(config)
    variables = init_variables(model, jax.random.key(8))
    _, _, x, y, images_u8, labels = tiny
    return model, variables, x, y, images_u8, labels


@functools.partial(jax.jit, static_argnames=("model", "log_prior_top"))
def _ladder_log_weights_by_hand(model, variables, x, y, noise, log_prior_top):
    """log p(x | z, y) + sum_l log p(z_l | z_l+1, y) + log p(z_top | y) - sum_l log q(z_l | ...)
    from the ladder's own pass, written out layer by layer (jitted: eager, each op compiled on
    its own)."""
    logits, layers = model.apply(variables, x, y, noise, train=False, method="_pass")
    *lower, top = layers
    log_px = -densities.reconstruction(logits, jnp.broadcast_to(x, logits.shape), "bernoulli")
    log_q = sum(densities.gaussian_log_density(t.z, t.q_mean, t.q_logvar) for t in layers)
    log_p = sum(densities.gaussian_log_density(t.z, t.p_mean, t.p_logvar) for t in lower)
    return log_px + log_p + log_prior_top(top.z, y) - log_q


def test_ladder_log_weights_are_its_own_densities_over_every_layer(tiny_ladder):
    model, variables, x, y, _, _ = tiny_ladder
    key = jax.random.key(9)
    bound = iwae.create_iwae_fn(model, 1)(variables, x, y, key)
    noise = iwae.sample_noise(key, 0, (32, model.noise_dim))[None]
    # The fixture's mixture is the unfitted one, every component N(0, I): the standard prior.
    elbo = _ladder_log_weights_by_hand(model, variables, x, y, noise,
                                       lambda z, _: densities.standard_log_density(z))[0]
    np.testing.assert_allclose(bound, elbo, rtol=1e-5, atol=1e-4)
    whole = iwae.create_iwae_fn(model, 12, chunk=12)(variables, x, y, key)
    chunked = iwae.create_iwae_fn(model, 12, chunk=5)(variables, x, y, key)
    np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-4)
    assert float(whole.mean()) > float(bound.mean())


def test_the_prior_collections_mixture_is_the_top_layers_density(tiny_ladder):
    model, variables, x, y, _, _ = tiny_ladder
    module = learned_prior.GaussianMixturePrior(components=3, latent_dim=model.code_dim,
                                                num_classes=model.num_classes)
    mixture = module.apply(module.init(jax.random.key(10)))
    with_prior = {**variables, "prior": {prior_lib.VARIABLE: learned_prior.as_mixture(mixture)}}
    key = jax.random.key(11)
    indices = jnp.arange(2)
    ours = log_weights(model, with_prior, images=x, labels=y, key=key, indices=indices)
    noise = jax.vmap(lambda k: iwae.sample_noise(key, k, (32, model.noise_dim)))(indices)
    expected = _ladder_log_weights_by_hand(
        model, variables, x, y, noise,
        lambda z, labels: learned_prior.diagonal_log_density(mixture, z, labels))
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-3)


def test_ladder_test_set_bounds_pass_the_marginal_check(tiny_ladder):
    model, variables, _, _, images_u8, labels = tiny_ladder
    bounds = iwae.test_set_bounds(model, variables, images_u8=images_u8, labels=labels,
                                  key=jax.random.key(12),
                                  num_samples=4, marginal_samples=2, batch_size=12, chunk=4)
    assert bounds["label_bounds"].shape == (32, model.num_classes)
    check = iwae.check_marginal(bounds["log_px_given_y"], bounds["log_px_given_label"],
                                bounds["log_px"])
    assert check["ok"], check
