"""The ladder VAE on tiny shapes: the precision-weighted posterior, the per-layer KLs and
densities, the noise layout (top layer first), generate/decode/encode, importance-sample axes,
and a few steps of importance-weighted training that lower the loss."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cvae import presets
from cvae.data.synthetic import synthetic_images
from cvae.model import hierarchical as hv
from cvae.model import objectives as obj
from cvae.model.losses import reconstruction
from cvae.model.networks import pixel_means

DIMS = (4, 3, 2)  # bottom first: total 9


@pytest.fixture(scope="module")
def ladder():
    model = hv.LadderCVAE(latent_dims=DIMS, hidden_sizes=(32, 16), upper_width=8,
                          activation="tanh")
    variables = hv.init_ladder(model, jax.random.key(0))
    labels = jnp.array([0, 3, 7, 9, 1, 4], jnp.int32)
    x = jax.random.bernoulli(jax.random.key(1), 0.3, (6, 784)).astype(jnp.float32)
    return model, variables, x, labels


def run(ladder, noise, method=None, **kwargs):
    model, variables, x, labels = ladder
    return model.apply(variables, x, labels, noise, method=method, **kwargs)


def test_combine_is_the_normalised_product_of_the_two_gaussians():
    mean, logvar = hv.combine((jnp.array(1.0), jnp.array(0.0)), (jnp.array(3.0), jnp.array(0.0)))
    assert float(mean) == pytest.approx(2.0) and float(jnp.exp(logvar)) == pytest.approx(0.5)
    mean, logvar = hv.combine((jnp.array(1.0), jnp.array(0.0)),
                              (jnp.array(3.0), jnp.array(math.log(3.0))))
    assert float(mean) == pytest.approx(1.5) and float(jnp.exp(logvar)) == pytest.approx(0.75)
    # log N(z; bu) + log N(z; td) - log N(z; q) does not depend on z: q is their product.
    z = jnp.linspace(-5, 5, 11)[:, None]
    args = [jnp.array([0.3]), jnp.array([1.2]), jnp.array([-2.0]), jnp.array([-0.7])]
    q = hv.combine(args[:2], args[2:])
    gap = (obj.gaussian_log_density(z, args[0], args[1])
           + obj.gaussian_log_density(z, args[2], args[3]) - obj.gaussian_log_density(z, *q))
    np.testing.assert_allclose(gap, gap[0], rtol=1e-5)
    # Extreme precisions stay finite.
    mean, logvar = hv.combine((jnp.array(1.0), jnp.array(-30.0)), (jnp.array(5.0), jnp.array(30.0)))
    assert float(mean) == pytest.approx(1.0) and float(logvar) == pytest.approx(-30.0)


def test_shapes_and_the_draws_reparameterisation(ladder):
    noise = jax.random.normal(jax.random.key(2), (6, 9))
    out = run(ladder, noise)
    assert out.logits.shape == (6, 784)
    assert [t.z.shape for t in out.layers] == [(6, 4), (6, 3), (6, 2)]
    # The noise is laid out top layer first: [eps_3 (2), eps_2 (3), eps_1 (4)].
    eps = {2: noise[:, :2], 1: noise[:, 2:5], 0: noise[:, 5:]}
    for layer, terms in enumerate(out.layers):
        np.testing.assert_allclose(terms.z, terms.q_mean + jnp.exp(0.5 * terms.q_logvar)
                                   * eps[layer], rtol=1e-6)


def test_the_top_layers_posterior_is_encodes_and_its_prior_standard(ladder):
    model, variables, x, labels = ladder
    out = run(ladder, jnp.zeros((6, 9)))
    mean, logvar = model.apply(variables, x, labels, method="encode")
    np.testing.assert_array_equal(out.layers[-1].q_mean, mean)
    np.testing.assert_array_equal(out.layers[-1].q_logvar, logvar)
    np.testing.assert_array_equal(out.layers[-1].p_mean, 0.0)
    np.testing.assert_array_equal(out.layers[-1].p_logvar, 0.0)


def test_lower_posteriors_combine_the_bottom_up_and_the_top_down_at_the_draw_above(ladder):
    model, variables, x, labels = ladder
    out = run(ladder, jax.random.normal(jax.random.key(3), (6, 9)))
    onehot = jax.nn.one_hot(labels, 10)
    bottom_up = model.apply(variables, x, onehot, method="bottom_up")
    for layer in (0, 1):
        prior = model.apply(variables, layer, out.layers[layer + 1].z, onehot, method="top_down")
        np.testing.assert_allclose(out.layers[layer].p_mean, prior[0], rtol=1e-6)
        q = hv.combine(bottom_up[layer], prior)
        np.testing.assert_allclose(out.layers[layer].q_mean, q[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out.layers[layer].q_logvar, q[1], rtol=1e-5, atol=1e-6)


def test_noise_of_a_lower_layer_leaves_the_layers_above_unchanged(ladder):
    noise = jax.random.normal(jax.random.key(4), (6, 9))
    moved = noise.at[:, 5:].add(1.0)  # the bottom layer's noise only
    a, b = run(ladder, noise), run(ladder, moved)
    for layer in (1, 2):
        np.testing.assert_array_equal(a.layers[layer].z, b.layers[layer].z)
    assert not np.allclose(a.layers[0].z, b.layers[0].z)
    moved = noise.at[:, :2].add(1.0)  # the top layer's noise moves every posterior below
    assert not np.allclose(a.layers[0].q_mean, run(ladder, moved).layers[0].q_mean)


def test_per_layer_kls_are_the_analytic_gaussian_kls_and_average_log_q_minus_log_p(ladder):
    _, _, _, labels = ladder
    out = run(ladder, jnp.zeros((6, 9)))
    kls = hv.layer_kls(out)
    assert [k.shape for k in kls] == [(6, 4), (6, 3), (6, 2)]
    top = out.layers[-1]
    np.testing.assert_allclose(kls[-1], 0.5 * (jnp.exp(top.q_logvar) + jnp.square(top.q_mean)
                                               - 1.0 - top.q_logvar), rtol=1e-5, atol=1e-6)
    assert all(float(k.min()) >= -1e-6 for k in kls)
    # Single-layer check of E_q[log q - log p] = KL, by Monte Carlo on the top layer alone.
    draws = run(ladder, jax.random.normal(jax.random.key(5), (20000, 6, 9)))
    mc = (obj.gaussian_log_density(draws.layers[-1].z, draws.layers[-1].q_mean,
                                   draws.layers[-1].q_logvar)
          - obj.gaussian_log_density(draws.layers[-1].z, 0.0, 0.0)).mean(axis=0)
    np.testing.assert_allclose(mc, kls[-1].sum(-1), atol=0.05)
    assert hv.log_q(out).shape == hv.log_p(out, labels).shape == (6,)


def test_log_p_with_a_learned_top_prior_swaps_only_the_top_term(ladder):
    _, _, _, labels = ladder
    out = run(ladder, jax.random.normal(jax.random.key(6), (6, 9)))
    standard = hv.log_p(out, labels)
    shifted = hv.log_p(out, labels, lambda z, y: obj.gaussian_log_density(z, 0.0, 0.0) - 1.0)
    np.testing.assert_allclose(shifted, standard - 1.0, rtol=1e-6)


def test_importance_sample_axes_give_the_per_sample_results(ladder):
    noise = jax.random.normal(jax.random.key(7), (3, 6, 9))
    stacked = run(ladder, noise)
    assert stacked.logits.shape == (3, 6, 784)
    for k in range(3):
        alone = run(ladder, noise[k])
        np.testing.assert_allclose(stacked.logits[k], alone.logits, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(hv.log_q(stacked)[k], hv.log_q(alone), rtol=1e-5)


def test_generate_with_zero_lower_noise_is_decode_of_the_top_code(ladder):
    model, variables, _, labels = ladder
    top = jax.random.normal(jax.random.key(8), (6, 2))
    noise = jnp.concatenate([top, jnp.zeros((6, 7))], axis=-1)
    generated = model.apply(variables, noise, labels, method="generate")
    decoded = model.apply(variables, top, labels, method="decode")
    np.testing.assert_array_equal(generated, decoded)
    again = model.apply(variables, noise, labels, method="generate")
    np.testing.assert_array_equal(generated, again)  # one noise vector -> one picture
    full = jax.random.normal(jax.random.key(9), (6, 9))
    mapped = model.apply(variables, full, labels, lambda eps, y: eps + 2.0, method="generate")
    shifted = model.apply(variables, full.at[:, :2].add(2.0), labels, method="generate")
    np.testing.assert_allclose(mapped, shifted, rtol=1e-6)


def test_scoring_a_draw_gives_the_outputs_of_the_call_that_drew_it(ladder):
    model, variables, x, labels = ladder
    drawn = run(ladder, jax.random.normal(jax.random.key(12), (2, 6, 9)))
    z = model.join([t.z for t in drawn.layers])
    scored = model.apply(variables, x, labels, z, method="score")
    for a, b in zip(jax.tree.leaves(drawn), jax.tree.leaves(scored)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_posterior_means_decoded_are_the_zero_noise_reconstruction(ladder):
    model, variables, x, labels = ladder
    means = model.apply(variables, x, labels, method="posterior_means")
    assert means.shape == (6, 9)
    logits = model.apply(variables, means, labels, method="decode_all")
    np.testing.assert_allclose(logits, run(ladder, jnp.zeros((6, 9))).logits, rtol=1e-6)


def test_create_ladder_reads_the_config():
    config = presets.test().replace(stochastic_layers=3, upper_latent_dim=2)
    model = hv.create_ladder(config)
    assert model.latent_dims == (config.latent_dim, 2, 2)
    variables = hv.init_ladder(model, jax.random.key(10))
    assert "top_down_heads_1" in variables["params"]


def test_a_few_dreg_steps_lower_the_loss_and_move_every_parameter():
    """Two layers, K = 4, on synthetic digits, the DReG surrogate (`score` gives log q and
    log p of fixed draws): the bound rises and every parameter moves."""
    model = hv.LadderCVAE(latent_dims=(4, 2), hidden_sizes=(32,), upper_width=16)
    params = hv.init_ladder(model, jax.random.key(11))["params"]
    labels = jnp.arange(32, dtype=jnp.int32) % 10
    x = (jnp.asarray(synthetic_images(np.asarray(labels)).reshape(32, 784)) > 127).astype(
        jnp.float32)

    def loss_fn(params, key):
        noise = jax.random.normal(key, (4, 32, 6))

        def sample_fn(p):
            return model.join([t.z for t in model.apply({"params": p}, x, labels, noise).layers])

        def log_q_fn(p, z):  # the density of given draws under p's networks
            return hv.log_q(model.apply({"params": p}, x, labels, z, method="score"))

        def log_joint_fn(p, z):
            scored = model.apply({"params": p}, x, labels, z, method="score")
            return -reconstruction(scored.logits, x, "bernoulli") + hv.log_p(scored, labels)

        return -obj.dreg_surrogate(*obj.dreg_log_weights(params, (sample_fn, log_q_fn,
                                                          log_joint_fn))).mean()

    tx = optax.adam(1e-2)
    state = tx.init(params)
    step = jax.jit(lambda p, s, k: _adam_step(loss_fn, tx, p, s, k))
    first, moved = None, params
    for i in range(25):
        moved, state, loss = step(moved, state, jax.random.key(i))
        first = float(loss) if first is None else first
    assert float(loss) < first - 50
    assert all(float(jnp.abs(a - b).max()) > 0 for a, b in zip(jax.tree.leaves(params),
                                                               jax.tree.leaves(moved)))
    assert pixel_means(model.apply({"params": moved}, jnp.zeros((2, 6)), labels[:2],
                                   method="generate")).shape == (2, 784)


def _adam_step(loss_fn, tx, params, state, key):
    loss, grads = jax.value_and_grad(loss_fn)(params, key)
    updates, state = tx.update(grads, state)
    return optax.apply_updates(params, updates), state, loss
