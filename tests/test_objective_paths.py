"""Every objective through the one path (cvae/model/objectives.py on a family's `Terms`), on
tiny shapes: the one-latent ELBO is the loss written out by hand, free bits act per layer of a
ladder, the importance-weighted objectives share their value and differ in their gradient,
learned priors get gradients and are written in the fitted mixture's format, which `cvae eval`
scores as the live prior."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cvae.config import presets
from cvae.model import densities, objectives
from cvae.model import prior as prior_lib
from cvae.model.registry import create_model, init_variables
from cvae.training.loop import create_prior_fit
from cvae.training.step import create_train_state
from cvae.training.supervision import FullLabels

B = 6


def batch():
    x = jax.random.bernoulli(jax.random.key(1), 0.3, (B, 784)).astype(jnp.float32)
    return x, jnp.array([0, 3, 7, 9, 1, 4], jnp.int32)


# Each prior's own size (a setting only the priors that have it take): 3 components of a
# mixture, 2 pseudo-inputs of the VampPrior.
SIZES = {"standard": {}, "mixture": {"prior_components": 3},
         "learned_mixture": {"prior_components": 3}, "vamp": {"pseudo_inputs": 2}}


def ladder(prior="standard", **changes):
    config = presets.test().replace(model="ladder", stochastic_layers=2, upper_latent_dim=3,
                                    prior=prior, **SIZES[prior], **changes)
    model = create_model(config)
    return model, init_variables(model, jax.random.key(0)), config


@functools.partial(jax.jit, static_argnames=("model", "config", "kl_weight", "key"))
def loss_of(model, variables, config, kl_weight=1.0, key=2):
    """The batch's (loss, terms) under the config's objective, as the train step takes them
    (jitted, as there: run op by op, each call compiled about a hundred small programs)."""
    x, y = batch()
    noise = objectives.draw_noise(jax.random.key(key), model,
                                  samples=config.objective.importance_samples, batch=B)
    rows, _, _ = objectives.row_terms(model, variables, images=x, labels=y, noise=noise,
                                      objective=config.objective.bound, kl_weight=kl_weight)
    return objectives.batch_loss(rows, objective=config.objective.bound, kl_weight=kl_weight,
                                 free_bits=config.objective.free_bits)


def written_prior(model, variables, config) -> dict:
    """The "prior" collection the training loop writes for a learned prior (create_prior_fit)."""
    state = create_train_state(model, optax.adam(1e-3), config, key=jax.random.key(0))
    state = state.replace(params=variables["params"])
    write = create_prior_fit(model, config, FullLabels(config))
    return write(state, None, None, None).prior


@pytest.mark.parametrize("free_bits", [0.0, 0.5])
def test_the_one_latent_elbo_is_the_loss_written_out(free_bits):
    config = presets.test().replace(prior="standard", free_bits=free_bits)
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    x, y = batch()
    loss, terms = loss_of(model, variables, config, kl_weight=0.7)
    noise = objectives.draw_noise(jax.random.key(2), model, samples=1, batch=B)
    mean, logvar = model.apply(variables, x, y, method="encode")
    logits = model.apply(variables, mean + jnp.exp(0.5 * logvar) * noise[0], y,
                         method="decode")
    rec = densities.reconstruction(logits, x, "bernoulli").mean()
    per_dim = densities.kl_per_dimension(mean, logvar).mean(axis=0)
    counted = jnp.maximum(per_dim, free_bits).sum() if free_bits else per_dim.sum()
    np.testing.assert_allclose(loss, rec + 0.7 * counted, rtol=1e-5)
    np.testing.assert_allclose(terms["kl"], per_dim.sum(), rtol=1e-5)
    assert set(terms) >= {"reconstruction", "kl", "loss"}


def test_ladder_free_bits_floor_every_layer_and_warm_up_scales_the_kl():
    model, variables, config = ladder()
    _, terms = loss_of(model, variables, config)
    floored, _ = loss_of(model, variables, config.replace(free_bits=50.0), kl_weight=0.5)
    np.testing.assert_allclose(floored, terms["reconstruction"] + 0.5 * 50.0 * model.noise_dim,
                               rtol=1e-5)
    cold, _ = loss_of(model, variables, config, kl_weight=0.0)
    np.testing.assert_allclose(cold, terms["reconstruction"], rtol=1e-5)


@pytest.mark.slow  # the objective and prior matrix: `make test-slow`
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


@pytest.mark.slow  # the objective and prior matrix: `make test-slow`
@pytest.mark.parametrize("prior", ["vamp", "learned_mixture"])
def test_a_learned_prior_is_written_in_the_fitted_mixtures_format(prior):
    model, variables, config = ladder(prior)
    collection = written_prior(model, variables, config)
    shapes = jax.tree.map(jnp.shape, dict(collection["mixture"]))
    assert shapes == jax.tree.map(jnp.shape, dict(variables[prior_lib.COLLECTION]["mixture"]))
    written = {"params": variables["params"], prior_lib.COLLECTION: collection}
    # cvae eval's bound through the collection is the bound through the live prior.
    x, y = batch()
    noise = jax.random.normal(jax.random.key(3), (2, B, model.noise_dim))
    evaluated = objectives.sampling_log_weights_fn(model, written)(x, y, noise)
    live = objectives.log_weights(model.apply({"params": variables["params"]}, x, y, noise,
                                              method="terms"))
    np.testing.assert_allclose(evaluated, live, rtol=1e-4, atol=1e-3)
    logits = model.apply(written, noise[0], y, method="generate")
    assert logits.shape == (B, 784) and np.all(np.isfinite(logits))


def test_the_learned_top_layer_kl_counts_in_the_elbo():
    model, variables, config = ladder("learned_mixture")
    loss, terms = loss_of(model, variables, config)
    assert np.isfinite(float(loss)) and float(terms["kl"]) > 0
    floored, _ = loss_of(model, variables, config.replace(free_bits=50.0))
    np.testing.assert_allclose(floored, terms["reconstruction"] + 50.0 * model.noise_dim,
                               rtol=1e-5)


@pytest.mark.slow  # the objective and prior matrix: `make test-slow`
@pytest.mark.parametrize("prior,objective", [("vamp", "elbo"), ("learned_mixture", "dreg")])
def test_the_one_latent_cvae_learns_its_prior_and_samples_from_it(prior, objective):
    config = presets.test().replace(prior=prior, **SIZES[prior], objective=objective,
                                    importance_samples=1 if objective == "elbo" else 3)
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    part = "pseudo_inputs" if prior == "vamp" else "learned"
    assert part in variables["params"]
    grads = jax.grad(lambda p: loss_of(model, {**variables, "params": p}, config)[0])(
        variables["params"])
    assert any(np.abs(np.asarray(g)).max() > 0 for g in jax.tree.leaves(grads[part]))
    written = {"params": variables["params"],
               prior_lib.COLLECTION: written_prior(model, variables, config)}
    x, y = batch()
    noise = jax.random.normal(jax.random.key(4), (B, config.model.options.latent_dim))
    assert model.apply(written, noise, y, method="generate").shape == (B, 784)
    # The collection's density is the learned prior's: cvae eval scores the prior it samples.
    live = model.apply({"params": variables["params"]}, noise[None], y, sampling=False,
                       method="log_prior")[0]
    np.testing.assert_allclose(model.apply(written, noise, y, sampling=True,
                                           method="log_prior"), live, rtol=1e-4, atol=1e-3)
