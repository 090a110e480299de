import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae.presets import test as test_config
from cvae.model.networks import CVAE, create_model, init_variables, reparameterize, soft_clamp


def param_count(params) -> int:
    return sum(x.size for x in jax.tree.leaves(params))


@pytest.mark.parametrize("architecture, conditioning", [("mlp", "first"), ("conv", "first"),
                                                        ("mlp", "every")])
def test_shapes_of_encode_decode_and_call(architecture, conditioning):
    config = test_config().replace(architecture=architecture, hidden_sizes=(32, 16),
                                   label_conditioning=conditioning)
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    images = jnp.zeros((5, 784))
    labels = jnp.arange(5)
    mean, logvar = model.apply(variables, images, labels, method=CVAE.encode)
    assert mean.shape == logvar.shape == (5, config.latent_dim)
    logits = model.apply(variables, mean, labels, method=CVAE.decode)
    assert logits.shape == (5, 784)
    out, mean2, _ = model.apply(variables, images, labels, jax.random.key(1))
    assert out.shape == (5, 784)
    np.testing.assert_array_equal(mean, mean2)


def test_mlp_parameter_count_follows_config():
    config = test_config().replace(hidden_sizes=(32, 16), latent_dim=4)
    params = init_variables(create_model(config), jax.random.key(0))["params"]
    encoder = (784 + 10) * 32 + 32 + 32 * 16 + 16 + 16 * 8 + 8
    # decoder: z and one-hot projections (no bias on the label one), then the MLP back to 784
    decoder = 4 * 16 + 16 + 10 * 16 + 16 * 32 + 32 + 32 * 784 + 784
    assert param_count(params) == encoder + decoder


@pytest.mark.parametrize("conditioning", ["first", "every"])
def test_label_changes_the_decoded_image(conditioning):
    config = test_config().replace(label_conditioning=conditioning, hidden_sizes=(32, 16))
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    z = jnp.zeros((2, config.latent_dim))
    logits = model.apply(variables, z, jnp.array([3, 7]), method=CVAE.decode)
    assert not np.allclose(logits[0], logits[1])


def test_log_variance_is_bounded_even_for_huge_inputs():
    config = test_config().replace(logvar_bound=5.0)
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    variables = jax.tree.map(lambda p: p * 1e4, variables)
    _, logvar = model.apply(variables, jnp.ones((3, 784)), jnp.arange(3), method=CVAE.encode)
    assert np.all(np.abs(np.asarray(logvar)) <= 5.0)
    assert np.all(np.isfinite(np.exp(np.asarray(logvar))))


def test_soft_clamp_is_identity_near_zero_and_bounded():
    x = jnp.array([-1e6, -0.01, 0.0, 0.01, 1e6])
    y = np.asarray(soft_clamp(x, 8.0))
    np.testing.assert_allclose(y[1:4], [-0.01, 0.0, 0.01], atol=1e-6)
    assert y[0] == pytest.approx(-8.0) and y[-1] == pytest.approx(8.0)


def test_reparameterize_has_the_requested_mean_and_variance():
    mean = jnp.full((20000, 1), 2.0)
    logvar = jnp.full((20000, 1), jnp.log(0.25))
    z = np.asarray(reparameterize(jax.random.key(0), mean, logvar))
    assert z.mean() == pytest.approx(2.0, abs=0.02)
    assert z.std() == pytest.approx(0.5, abs=0.02)


def test_batch_norm_and_dropout_variables_exist_when_enabled():
    config = test_config().replace(batch_norm=True, dropout_rate=0.5)
    variables = init_variables(create_model(config), jax.random.key(0))
    assert "batch_stats" in variables
