"""The ladder family (cvae/model/ladder.py, `--model ladder`) on tiny shapes: the
precision-weighted posterior, the per-layer KLs and densities in its `Terms`, the noise layout
(top layer first), generate/decode/encode, importance-sample axes, scoring given draws, and a
few steps of DReG training that lower the loss. (End to end: tests/test_ladder.py.)"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cvae.config import presets
from cvae.data.synthetic import synthetic_images
from cvae.model import densities, learned_prior, objectives, registry
from cvae.model.densities import pixel_means
from cvae.model.ladder import combine
from cvae.model.registry import create_model, init_variables
from jitted import apply

DIMS = (4, 3, 3)  # bottom first: total 10, the noise [eps_top (3), eps_middle (3), eps_bottom (4)]
TOTAL = sum(DIMS)
CONFIG = presets.test().replace(model="ladder", stochastic_layers=3, latent_dim=4,
                                upper_latent_dim=3, hidden_sizes=(32, 16), activation="tanh")


@pytest.fixture(scope="module")
def ladder():
    model = create_model(CONFIG)
    variables = init_variables(model, jax.random.key(0))
    labels = jnp.array([0, 3, 7, 9, 1, 4], jnp.int32)
    x = jax.random.bernoulli(jax.random.key(1), 0.3, (6, 784)).astype(jnp.float32)
    return model, variables, x, labels


# Jitted, as `jitted.apply`: eager, every op of a pass is compiled on its own.
@functools.partial(jax.jit, static_argnums=0)
def _pass(model, variables, x, labels, noise):
    return model.apply(variables, method=lambda m: m._pass(x, labels, noise, train=False))


@functools.partial(jax.jit, static_argnums=(0, 2))  # the layer picks the network: static
def top_down(model, variables, layer, z_above, onehot):
    return model.apply(variables, layer, z_above, onehot, method="top_down")


def walk(ladder, noise):
    """The reparameterised pass: (pixel logits, the layers bottom first) for noise
    f32[..., B, TOTAL]."""
    return _pass(*ladder, noise)


def terms_of(ladder, noise):
    model, variables, x, labels = ladder
    return apply(model, variables, x, labels, noise, method="terms")


@functools.partial(jax.jit, static_argnums=0)
def _latents(model, variables, x, labels, noise):
    _, layers = _pass(model, variables, x, labels, noise)
    return layers, model.apply(variables, x, labels, noise, method="terms")._replace(log_px=None)


def latents_of(ladder, noise):
    """walk's layers and terms_of's terms less log p(x | z): XLA drops the decoder, most of the
    CPU time on many draws."""
    return _latents(*ladder, noise)


def test_combine_is_the_normalised_product_of_the_two_gaussians():
    mean, logvar = combine((jnp.array(1.0), jnp.array(0.0)), (jnp.array(3.0), jnp.array(0.0)))
    assert float(mean) == pytest.approx(2.0) and float(jnp.exp(logvar)) == pytest.approx(0.5)
    mean, logvar = combine((jnp.array(1.0), jnp.array(0.0)),
                           (jnp.array(3.0), jnp.array(math.log(3.0))))
    assert float(mean) == pytest.approx(1.5) and float(jnp.exp(logvar)) == pytest.approx(0.75)
    # log N(z; bu) + log N(z; td) - log N(z; q) does not depend on z: q is their product.
    z = jnp.linspace(-5, 5, 11)[:, None]
    args = [jnp.array([0.3]), jnp.array([1.2]), jnp.array([-2.0]), jnp.array([-0.7])]
    q = combine(args[:2], args[2:])
    gap = (densities.gaussian_log_density(z, args[0], args[1])
           + densities.gaussian_log_density(z, args[2], args[3])
           - densities.gaussian_log_density(z, *q))
    np.testing.assert_allclose(gap, gap[0], rtol=1e-5)
    # Extreme precisions stay finite.
    mean, logvar = combine((jnp.array(1.0), jnp.array(-30.0)), (jnp.array(5.0), jnp.array(30.0)))
    assert float(mean) == pytest.approx(1.0) and float(logvar) == pytest.approx(-30.0)


def test_the_widths_come_from_the_config(ladder):
    model = ladder[0]
    assert model.latent_dims == DIMS
    assert model.noise_dim == registry.noise_dim(CONFIG) == TOTAL
    assert model.code_dim == registry.code_dim(CONFIG) == 3
    assert registry.param_groups(CONFIG) == model.PARAM_GROUPS


def test_shapes_and_the_draws_reparameterisation(ladder):
    noise = jax.random.normal(jax.random.key(2), (6, TOTAL))
    logits, layers = walk(ladder, noise)
    assert logits.shape == (6, 784)
    assert [t.z.shape for t in layers] == [(6, 4), (6, 3), (6, 3)]
    # The noise is laid out top layer first: [eps_3 (3), eps_2 (3), eps_1 (4)].
    eps = {2: noise[:, :3], 1: noise[:, 3:6], 0: noise[:, 6:]}
    for layer, terms in enumerate(layers):
        np.testing.assert_allclose(terms.z, terms.q_mean + jnp.exp(0.5 * terms.q_logvar)
                                   * eps[layer], rtol=1e-6)
    model, variables, x, labels = ladder
    drawn = apply(model, variables, x, labels, noise[None], method="draws")
    # Two programs of float32 sums: a value near zero differs in its last bits (atol).
    np.testing.assert_allclose(drawn[0], model.join([t.z for t in layers]), rtol=1e-6, atol=1e-6)


def test_the_top_layers_posterior_is_encodes_and_its_prior_standard(ladder):
    model, variables, x, labels = ladder
    _, layers = walk(ladder, jnp.zeros((6, TOTAL)))
    mean, logvar = apply(model, variables, x, labels, method="encode")
    np.testing.assert_array_equal(layers[-1].q_mean, mean)
    np.testing.assert_array_equal(layers[-1].q_logvar, logvar)
    np.testing.assert_array_equal(layers[-1].p_mean, 0.0)
    np.testing.assert_array_equal(layers[-1].p_logvar, 0.0)


def test_lower_posteriors_combine_the_bottom_up_and_the_top_down_at_the_draw_above(ladder):
    model, variables, x, labels = ladder
    _, layers = walk(ladder, jax.random.normal(jax.random.key(3), (6, TOTAL)))
    onehot = jax.nn.one_hot(labels, 10)
    bottom_up = apply(model, variables, x, onehot, method="bottom_up")
    for layer in (0, 1):
        prior = top_down(model, variables, layer, layers[layer + 1].z, onehot)
        np.testing.assert_allclose(layers[layer].p_mean, prior[0], rtol=1e-6)
        q = combine(bottom_up[layer], prior)
        np.testing.assert_allclose(layers[layer].q_mean, q[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(layers[layer].q_logvar, q[1], rtol=1e-5, atol=1e-6)


def test_noise_of_a_lower_layer_leaves_the_layers_above_unchanged(ladder):
    noise = jax.random.normal(jax.random.key(4), (6, TOTAL))
    moved = noise.at[:, 6:].add(1.0)  # the bottom layer's noise only
    (_, a), (_, b) = walk(ladder, noise), walk(ladder, moved)
    for layer in (1, 2):
        np.testing.assert_array_equal(a[layer].z, b[layer].z)
    assert not np.allclose(a[0].z, b[0].z)
    moved = noise.at[:, :3].add(1.0)  # the top layer's noise moves every posterior below
    assert not np.allclose(a[0].q_mean, walk(ladder, moved)[1][0].q_mean)


def test_per_layer_kls_are_the_analytic_gaussian_kls_and_average_log_q_minus_log_p(ladder):
    model = ladder[0]
    _, layers = walk(ladder, jnp.zeros((1, 6, TOTAL)))
    terms = terms_of(ladder, jnp.zeros((1, 6, TOTAL)))
    # Every layer's KL in closed form, joined top layer first like the noise; nothing sampled.
    assert terms.kl_dims.shape == (1, 6, TOTAL)
    np.testing.assert_array_equal(terms.kl_rest, 0.0)
    kls = model.split(terms.kl_dims[0])
    assert [k.shape for k in kls] == [(6, 4), (6, 3), (6, 3)]
    for kl, t in zip(kls, layers):
        np.testing.assert_allclose(kl, densities.gaussian_kl((t.q_mean[0], t.q_logvar[0]),
                                                             (t.p_mean[0], t.p_logvar[0])),
                                   rtol=1e-5, atol=1e-6)
    top = layers[-1]
    np.testing.assert_allclose(kls[-1][None], 0.5 * (jnp.exp(top.q_logvar) + jnp.square(top.q_mean)
                                                     - 1.0 - top.q_logvar), rtol=1e-5, atol=1e-6)
    assert float(terms.kl_dims.min()) >= -1e-6
    # E_q[log q - log p] = KL, by Monte Carlo: the top layer alone, and the whole chain.
    noise = jax.random.normal(jax.random.key(5), (20000, 6, TOTAL))
    draws, many = latents_of(ladder, noise)
    mc = (densities.gaussian_log_density(draws[-1].z, draws[-1].q_mean, draws[-1].q_logvar)
          - densities.standard_log_density(draws[-1].z)).mean(axis=0)
    np.testing.assert_allclose(mc, kls[-1].sum(-1), atol=0.05)
    chain = (many.log_qz - many.log_pz).mean(axis=0)
    np.testing.assert_allclose(chain, many.kl_dims.sum(-1).mean(axis=0), atol=0.1)
    assert terms.log_qz.shape == terms.log_pz.shape == terms.log_px.shape == (1, 6)


def test_a_learned_top_prior_swaps_only_the_top_term_and_samples_its_kl():
    """Under a learned prior the top layer's log p is the mixture's, and its KL is the draw's
    estimate (kl_rest); the layers below keep theirs in closed form."""
    model = create_model(CONFIG)
    learned = create_model(CONFIG.replace(prior="learned_mixture", prior_components=2))
    variables = init_variables(learned, jax.random.key(0))
    plain = {"params": {k: v for k, v in variables["params"].items() if k != "learned"}}
    x = jax.random.bernoulli(jax.random.key(1), 0.3, (6, 784)).astype(jnp.float32)
    labels = jnp.array([0, 3, 7, 9, 1, 4], jnp.int32)
    noise = jax.random.normal(jax.random.key(6), (2, 6, TOTAL))
    standard = apply(model, plain, x, labels, noise, method="terms")
    swapped = apply(learned, variables, x, labels, noise, method="terms")
    np.testing.assert_array_equal(swapped.log_px, standard.log_px)
    np.testing.assert_array_equal(swapped.log_qz, standard.log_qz)
    z_top = model.split(apply(model, plain, x, labels, noise, method="draws"))[-1]
    mixture = apply(learned, variables, method="prior_mixture")
    shift = (learned_prior.diagonal_log_density(mixture, z_top, labels)
             - densities.standard_log_density(z_top))
    np.testing.assert_allclose(swapped.log_pz, standard.log_pz + shift, rtol=1e-5, atol=1e-4)
    assert swapped.kl_dims.shape == (2, 6, TOTAL - 3)
    np.testing.assert_allclose(swapped.kl_dims, standard.kl_dims[..., 3:], rtol=1e-6)
    log_q_top = densities.gaussian_log_density(
        z_top, *apply(learned, variables, x, labels, method="encode"))
    np.testing.assert_allclose(swapped.kl_rest,
                               log_q_top - learned_prior.diagonal_log_density(mixture, z_top,
                                                                              labels),
                               rtol=1e-5, atol=1e-4)


def test_importance_sample_axes_give_the_per_sample_results(ladder):
    noise = jax.random.normal(jax.random.key(7), (3, 6, TOTAL))
    stacked_logits, _ = walk(ladder, noise)
    stacked = terms_of(ladder, noise)
    assert stacked_logits.shape == (3, 6, 784)
    for k in range(3):
        alone_logits, _ = walk(ladder, noise[k])
        alone = terms_of(ladder, noise[k:k + 1])
        np.testing.assert_allclose(stacked_logits[k], alone_logits, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(stacked.log_qz[k], alone.log_qz[0], rtol=1e-5)
        np.testing.assert_allclose(stacked.log_px[k], alone.log_px[0], rtol=1e-5)


def test_generate_with_zero_lower_noise_is_decode_of_the_top_code(ladder):
    model, variables, _, labels = ladder
    top = jax.random.normal(jax.random.key(8), (6, 3))
    noise = jnp.concatenate([top, jnp.zeros((6, TOTAL - 3))], axis=-1)
    generated = apply(model, variables, noise, labels, method="generate")
    decoded = apply(model, variables, top, labels, method="decode")
    np.testing.assert_array_equal(generated, decoded)
    again = apply(model, variables, noise, labels, method="generate")
    np.testing.assert_array_equal(generated, again)  # one noise vector -> one picture


def test_the_prior_sampling_rule_reads_the_top_layers_share_of_the_noise():
    model = create_model(CONFIG.replace(prior="mixture", prior_components=2))
    variables = init_variables(model, jax.random.key(0))
    labels = jnp.arange(6, dtype=jnp.int32)
    full = jax.random.normal(jax.random.key(9), (6, TOTAL))

    def shifted(mixture, eps, y, *, radius):
        assert eps.shape == (6, 3)
        return eps + 2.0

    def unchanged(mixture, eps, y, *, radius):
        return eps

    mapped = model.apply(variables, full, labels, shifted, method="generate")
    moved = model.apply(variables, full.at[:, :3].add(2.0), labels, unchanged,
                        method="generate")
    np.testing.assert_allclose(mapped, moved, rtol=1e-6)


def test_scoring_a_draw_gives_the_terms_of_the_call_that_drew_it(ladder):
    model, variables, x, labels = ladder
    noise = jax.random.normal(jax.random.key(12), (2, 6, TOTAL))
    drawn = terms_of(ladder, noise)
    z = apply(model, variables, x, labels, noise, method="draws")
    scored = apply(model, variables, x, labels, z, method="score")
    for a, b in zip(jax.tree.leaves(drawn), jax.tree.leaves(scored)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_reconstruct_is_the_elbo_at_every_layers_posterior_mean(ladder):
    model, variables, x, labels = ladder
    mean, logvar, neg_elbo = apply(model, variables, x, labels, method="reconstruct")
    assert mean.shape == logvar.shape == (6, 3)
    top = apply(model, variables, x, labels, method="encode")
    np.testing.assert_array_equal(mean, top[0])
    zero = terms_of(ladder, jnp.zeros((1, 6, TOTAL)))
    np.testing.assert_allclose(neg_elbo, -zero.log_px[0] + zero.kl_dims[0].sum(-1), rtol=1e-5)


def test_create_model_reads_the_config():
    config = presets.test().replace(model="ladder", stochastic_layers=3, upper_latent_dim=2)
    model = create_model(config)
    assert model.latent_dims == (config.model.options.latent_dim, 2, 2)
    variables = init_variables(model, jax.random.key(10))
    assert "top_down_heads_1" in variables["params"]


def test_a_few_dreg_steps_lower_the_loss_and_move_every_parameter():
    """Two layers, K = 4, on synthetic digits, DReG's surrogate through `objectives.row_terms`
    (`score` gives log q and log p of fixed draws): the bound rises and every parameter moves."""
    config = presets.test().replace(model="ladder", stochastic_layers=2, upper_latent_dim=2,
                                    hidden_sizes=(32, 16), objective="dreg",
                                    importance_samples=4)
    model = create_model(config)
    params = init_variables(model, jax.random.key(11))["params"]
    labels = jnp.arange(32, dtype=jnp.int32) % 10
    x = (jnp.asarray(synthetic_images(np.asarray(labels)).reshape(32, 784)) > 127).astype(
        jnp.float32)

    def loss_fn(params, key):
        noise = objectives.draw_noise(key, model, samples=4, batch=32)
        rows, _, _ = objectives.row_terms(model, {"params": params}, images=x, labels=labels,
                                          noise=noise, objective="dreg", kl_weight=1.0)
        return objectives.batch_loss(rows, objective="dreg", kl_weight=1.0, free_bits=0.0)[0]

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
    assert pixel_means(apply(model, {"params": moved}, jnp.zeros((2, model.noise_dim)),
                                   labels[:2], method="generate")).shape == (2, 784)


def _adam_step(loss_fn, tx, params, state, key):
    loss, grads = jax.value_and_grad(loss_fn)(params, key)
    updates, state = tx.update(grads, state)
    return optax.apply_updates(params, updates), state, loss
