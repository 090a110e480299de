"""The training loss of each model lever (cvae/model/lever_losses.py) on tiny shapes: the ELBO
path is today's loss, free bits act per layer, the importance-weighted objectives share their
value and differ in their gradient, learned priors get gradients and are written in the
fitted mixture's format."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae import presets
from cvae.evaluation import iwae
from cvae.model import hierarchical as hv
from cvae.model import lever_losses as ll
from cvae.model import prior as prior_lib
from cvae.model.losses import vae_loss
from cvae.model.registry import create_model, init_variables

B = 6


def batch():
    x = jax.random.bernoulli(jax.random.key(1), 0.3, (B, 784)).astype(jnp.float32)
    return x, jnp.array([0, 3, 7, 9, 1, 4], jnp.int32)


def ladder(prior="standard", **changes):
    config = presets.test().replace(stochastic_layers=2, upper_latent_dim=3, prior=prior,
                                       prior_components=3, pseudo_inputs=2, **changes)
    model = hv.create_ladder(config)
    return model, hv.init_ladder(model, jax.random.key(0)), config


def loss_of(model, variables, config, kl_weight=1.0, key=2):
    x, y = batch()
    noise = ll.draw_noise(jax.random.key(key), model, config=config, batch=B)
    return ll.lever_loss(model, variables, images=x, labels=y, noise=noise, config=config,
                         kl_weight=kl_weight)


@pytest.mark.parametrize("free_bits", [0.0, 0.5])
def test_the_one_latent_elbo_is_todays_loss(free_bits):
    config = presets.test().replace(prior="standard", free_bits=free_bits)
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    x, y = batch()
    noise = ll.draw_noise(jax.random.key(2), model, config=config, batch=B)
    loss, terms = ll.lever_loss(model, variables, images=x, labels=y, noise=noise,
                                config=config, kl_weight=0.7)
    mean, logvar = model.apply(variables, x, y, method="encode")
    logits = model.apply(variables, mean + jnp.exp(0.5 * logvar) * noise[0], y,
                         method="decode")
    expected, _ = vae_loss(logits, x, mean=mean, logvar=logvar, likelihood="bernoulli",
                           kl_weight=0.7, free_bits=free_bits)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert set(terms) >= {"reconstruction", "kl", "loss"}


def test_ladder_free_bits_floor_every_layer_and_warm_up_scales_the_kl():
    model, variables, config = ladder()
    _, terms = loss_of(model, variables, config)
    floored, _ = loss_of(model, variables, config.replace(free_bits=50.0), kl_weight=0.5)
    np.testing.assert_allclose(floored, terms["reconstruction"] + 0.5 * 50.0 * model.total_dim,
                               rtol=1e-5)
    cold, _ = loss_of(model, variables, config, kl_weight=0.0)
    np.testing.assert_allclose(cold, terms["reconstruction"], rtol=1e-5)


@pytest.mark.parametrize("prior", ["standard", "vamp", "learned_mixture"])
def test_iwae_and_dreg_share_their_value_and_differ_in_their_gradient(prior):
    model, variables, config = ladder(prior)
    configs = {o: config.replace(objective=o, importance_samples=4) for o in ("iwae", "dreg")}

    def grad(objective):
        return jax.value_and_grad(lambda p: loss_of(model, {**variables, "params": p},
                                                    configs[objective])[0])(variables["params"])

    (iwae_loss, iwae_grad), (dreg_loss, dreg_grad) = grad("iwae"), grad("dreg")
    np.testing.assert_allclose(iwae_loss, dreg_loss, rtol=1e-5)
    leaves = [np.asarray(a - b) for a, b in zip(jax.tree.leaves(iwae_grad),
                                                jax.tree.leaves(dreg_grad))]
    assert max(np.abs(d).max() for d in leaves) > 0
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(dreg_grad))
    if prior != "standard":  # the learned prior's parameters get a gradient
        part = "pseudo_inputs" if prior == "vamp" else "learned"
        assert any(np.abs(np.asarray(g)).max() > 0
                   for g in jax.tree.leaves(dreg_grad[part]))


@pytest.mark.parametrize("prior", ["vamp", "learned_mixture"])
def test_a_learned_prior_is_written_in_the_fitted_mixtures_format(prior):
    model, variables, config = ladder(prior)
    collection = ll.learned_prior_collection(model, {"params": variables["params"]})
    shapes = jax.tree.map(jnp.shape, collection["mixture"])
    assert shapes == jax.tree.map(jnp.shape, dict(variables[prior_lib.COLLECTION]["mixture"]))
    written = {"params": variables["params"], prior_lib.COLLECTION: collection}
    # cvae eval's bound through the collection is the bound through the live prior.
    x, y = batch()
    noise = jax.random.normal(jax.random.key(3), (2, B, model.total_dim))
    evaluated = iwae.log_weights_fn(model, written, "bernoulli")(x, y, noise)
    fns = ll.weight_functions(model, {"params": variables["params"]}, images=x, labels=y,
                              noise=noise, likelihood="bernoulli", kl_weight=1.0)
    z = fns[0](variables["params"])
    live = fns[2](variables["params"], z) - fns[1](variables["params"], z)
    np.testing.assert_allclose(evaluated, live, rtol=1e-4, atol=1e-3)
    logits = model.apply(written, noise[0], y, method="generate")
    assert logits.shape == (B, 784) and np.all(np.isfinite(logits))


def test_the_learned_top_layer_kl_counts_in_the_elbo():
    model, variables, config = ladder("learned_mixture")
    loss, terms = loss_of(model, variables, config)
    assert np.isfinite(float(loss)) and float(terms["kl"]) > 0
    floored, _ = loss_of(model, variables, config.replace(free_bits=50.0))
    np.testing.assert_allclose(floored, terms["reconstruction"] + 50.0 * model.total_dim,
                               rtol=1e-5)


@pytest.mark.parametrize("prior,objective", [("vamp", "elbo"), ("learned_mixture", "dreg")])
def test_the_one_latent_cvae_learns_its_prior_and_samples_from_it(prior, objective):
    config = presets.test().replace(prior=prior, prior_components=3, pseudo_inputs=2,
                                       objective=objective,
                                       importance_samples=1 if objective == "elbo" else 3)
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    part = "pseudo_inputs" if prior == "vamp" else "learned"
    assert part in variables["params"]
    grads = jax.grad(lambda p: loss_of(model, {**variables, "params": p}, config)[0])(
        variables["params"])
    assert any(np.abs(np.asarray(g)).max() > 0 for g in jax.tree.leaves(grads[part]))
    written = {"params": variables["params"],
               prior_lib.COLLECTION: ll.learned_prior_collection(model, variables)}
    x, y = batch()
    noise = jax.random.normal(jax.random.key(4), (B, config.latent_dim))
    assert model.apply(written, noise, y, method="generate").shape == (B, 784)
    # The collection's density is the learned prior's: cvae eval scores the prior it samples.
    z = noise[None]
    live = ll.learned_log_prior(model, variables)(z, y)[0]
    np.testing.assert_allclose(model.apply(written, noise, y, method="log_prior"), live,
                               rtol=1e-4, atol=1e-3)
