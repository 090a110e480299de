"""The one-latent family (cvae/model/one_latent.py, `--model cvae`) on tiny shapes: encode,
decode and the interface's terms, draws and score; parameter counts; label conditioning; the
bounded log-variance; the reparameterised draws."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae.model import densities, registry
from cvae.model.layers import soft_clamp
from cvae.model.one_latent import OneLatent
from cvae.model.registry import create_model, init_variables
from cvae.config.presets import test as test_config


def param_count(params) -> int:
    return sum(x.size for x in jax.tree.leaves(params))


@pytest.mark.parametrize("architecture, conditioning", [("mlp", "first"), ("conv", "first"),
                                                        ("mlp", "every")])
def test_shapes_of_encode_decode_and_terms(architecture, conditioning):
    config = test_config().replace(architecture=architecture, hidden_sizes=(32, 16),
                                   label_conditioning=conditioning)
    model = create_model(config)
    assert isinstance(model, OneLatent)
    assert model.noise_dim == model.code_dim == config.model.options.latent_dim
    assert (registry.noise_dim(config) == registry.code_dim(config)
            == config.model.options.latent_dim)
    variables = init_variables(model, jax.random.key(0))
    images = jnp.zeros((5, 784))
    labels = jnp.arange(5)
    mean, logvar = model.apply(variables, images, labels, method="encode")
    assert mean.shape == logvar.shape == (5, config.model.options.latent_dim)
    logits = model.apply(variables, mean, labels, method="decode")
    assert logits.shape == (5, 784)
    noise = jax.random.normal(jax.random.key(1), (3, 5, config.model.options.latent_dim))
    terms = model.apply(variables, images, labels, noise, method="terms")
    assert terms.log_px.shape == terms.log_pz.shape == terms.log_qz.shape == (3, 5)
    assert terms.kl_dims.shape == (3, 5, config.model.options.latent_dim)
    # With zero noise the draw is the encoder's mean.
    zero = model.apply(variables, images, labels,
                       jnp.zeros((1, 5, config.model.options.latent_dim)),
                       method="draws")
    np.testing.assert_array_equal(zero[0], mean)


def test_terms_are_the_densities_of_the_draws_and_score_gives_them_back():
    config = test_config().replace(hidden_sizes=(32, 16), prior="standard")
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    x = jax.random.bernoulli(jax.random.key(1), 0.3, (4, 784)).astype(jnp.float32)
    y = jnp.array([1, 2, 3, 4])
    noise = jax.random.normal(jax.random.key(2), (2, 4, config.model.options.latent_dim))
    terms = model.apply(variables, x, y, noise, method="terms")
    mean, logvar = model.apply(variables, x, y, method="encode")
    z = model.apply(variables, x, y, noise, method="draws")
    np.testing.assert_allclose(z, mean + jnp.exp(0.5 * logvar) * noise, rtol=1e-6)
    np.testing.assert_allclose(terms.log_qz, densities.gaussian_log_density(z, mean, logvar),
                               rtol=1e-5)
    np.testing.assert_allclose(terms.log_pz, densities.standard_log_density(z), rtol=1e-5)
    for k in range(2):
        logits = model.apply(variables, z[k], y, method="decode")
        np.testing.assert_allclose(terms.log_px[k],
                                   -densities.reconstruction(logits, x, "bernoulli"), rtol=1e-5)
    np.testing.assert_allclose(terms.kl_dims[1], densities.kl_per_dimension(mean, logvar),
                               rtol=1e-6)
    np.testing.assert_array_equal(terms.kl_rest, 0.0)
    scored = model.apply(variables, x, y, z, method="score")
    for a, b in zip(terms, scored):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_mlp_parameter_count_follows_config():
    config = test_config().replace(hidden_sizes=(32, 16), latent_dim=4)
    params = init_variables(create_model(config), jax.random.key(0))["params"]
    encoder = (784 + 10) * 32 + 32 + 32 * 16 + 16 + 16 * 8 + 8
    # decoder: z and one-hot projections (no bias on the label one), then the MLP back to 784
    decoder = 4 * 16 + 16 + 10 * 16 + 16 * 32 + 32 + 32 * 784 + 784
    assert param_count(params) == encoder + decoder
    assert set(params) == {"encoder", "decoder"}
    assert OneLatent.PARAM_GROUPS == {"encoder": ("encoder",), "decoder": ("decoder",)}


@pytest.mark.parametrize("conditioning", ["first", "every"])
def test_label_changes_the_decoded_image(conditioning):
    config = test_config().replace(label_conditioning=conditioning, hidden_sizes=(32, 16))
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    z = jnp.zeros((2, config.model.options.latent_dim))
    logits = model.apply(variables, z, jnp.array([3, 7]), method="decode")
    assert not np.allclose(logits[0], logits[1])


def test_log_variance_is_bounded_even_for_huge_inputs():
    config = test_config().replace(logvar_bound=5.0)
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    variables = jax.tree.map(lambda p: p * 1e4, variables)
    _, logvar = model.apply(variables, jnp.ones((3, 784)), jnp.arange(3), method="encode")
    assert np.all(np.abs(np.asarray(logvar)) <= 5.0)
    assert np.all(np.isfinite(np.exp(np.asarray(logvar))))


def test_soft_clamp_is_identity_near_zero_and_bounded():
    x = jnp.array([-1e6, -0.01, 0.0, 0.01, 1e6])
    y = np.asarray(soft_clamp(x, 8.0))
    np.testing.assert_allclose(y[1:4], [-0.01, 0.0, 0.01], atol=1e-6)
    assert y[0] == pytest.approx(-8.0) and y[-1] == pytest.approx(8.0)


def test_the_draws_have_the_posteriors_mean_and_variance():
    config = test_config().replace(latent_dim=1, hidden_sizes=(8,))
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    x, y = jnp.full((1, 784), 0.5), jnp.array([2])
    mean, logvar = model.apply(variables, x, y, method="encode")
    noise = jax.random.normal(jax.random.key(0), (20000, 1, 1))
    z = np.asarray(model.apply(variables, x, y, noise, method="draws"))
    assert z.mean() == pytest.approx(float(mean[0, 0]), abs=0.02)
    assert z.std() == pytest.approx(float(jnp.exp(0.5 * logvar[0, 0])), rel=0.02)


def test_reconstruct_is_the_elbo_at_the_posterior_mean():
    config = test_config().replace(hidden_sizes=(16,))
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    x = jax.random.bernoulli(jax.random.key(1), 0.3, (3, 784)).astype(jnp.float32)
    y = jnp.array([0, 5, 9])
    mean, logvar, neg_elbo = model.apply(variables, x, y, method="reconstruct")
    terms = model.apply(variables, x, y, jnp.zeros((1, 3, config.model.options.latent_dim)),
                        method="terms")
    np.testing.assert_allclose(neg_elbo, -terms.log_px[0] + terms.kl_dims[0].sum(-1), rtol=1e-5)


def test_batch_norm_and_dropout_variables_exist_when_enabled():
    config = test_config().replace(batch_norm=True, dropout_rate=0.5)
    variables = init_variables(create_model(config), jax.random.key(0))
    assert "batch_stats" in variables
