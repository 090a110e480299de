"""The training loss of every model lever (issue 26), as pure functions for the jitted step.

`lever_loss(model, variables, images=, labels=, noise=, config=, kl_weight=)` -> (loss,
terms): the batch-mean loss whose gradient the step takes, and its terms for the metrics
({"reconstruction", "kl", "loss"}, plus "bound" for the importance-weighted objectives). The
noise is unit normal, f32[K, B, D]: K = `importance_samples` draws per image, D the model's
noise width (`noise_width`: the latent, or every ladder layer, top layer first). A step draws
it from its own key, so the loss is a function of (params, batch, step) and resume is exact.

- ELBO (K = 1): reconstruction + beta * KL. KL per layer: the analytic KL of each layer's
  Gaussians (cvae/model/hierarchical.py `layer_kls`), or, for a learned prior's layer, the
  one-draw estimate log q(z|x,y) - log p(z|y). Free bits act per latent dimension (the floor on
  its batch-mean KL, as today) and per layer for a learned prior's layer (the floor times its
  width): so the top layer of a ladder is kept alive. KL warm-up is beta's schedule.
- IWAE / DReG (cvae/model/objectives.py): the K-sample bound, its plain gradient or the doubly
  reparameterised one. The KL weight scales log p(z|y) - log q(z|x,y) inside each log weight
  (beta = 1 is the bound itself; a warm-up anneals it); free bits do not apply.

The model: the one-latent CVAE (`encode`, `decode`; with a learned prior, `prior_mixture`) or
the ladder. Learned priors' parameters are in `variables["params"]`, so the optimizer trains
them with the rest.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from cvae.config import Config
from cvae.model import hierarchical, learned_prior
from cvae.model import objectives as obj
from cvae.model.log_weights import noise_width
from cvae.model.losses import kl_per_dimension, reconstruction

LEARNED_PRIORS = ("vamp", "learned_mixture")


def uses_levers(config: Config) -> bool:
    """Whether a run trains through `lever_loss`: an importance-weighted objective, a learned
    prior or a ladder. Today's model keeps its own loss (cvae/model/losses.py), to the bit."""
    return (config.objective != "elbo" or config.prior in LEARNED_PRIORS
            or config.stochastic_layers > 1)


def draw_noise(key: jax.Array, model, *, config: Config, batch: int) -> jax.Array:
    """The step's unit-normal noise, f32[K, B, D]."""
    return jax.random.normal(key, (config.importance_samples, batch, noise_width(model)))


def learned_log_prior(model, variables: dict) -> Callable | None:
    """log p(z_top | y) of a learned prior at the given parameters (z f32[..., B, L], labels
    i32[B] -> f32[..., B]), or None when the model's prior is not learnt."""
    if _prior_of(model) not in LEARNED_PRIORS:
        return None
    mixture = model.apply(variables, method="prior_mixture")
    return lambda z, labels: learned_prior.diagonal_log_density(mixture, z, labels)


def learned_prior_collection(model, variables: dict) -> dict:
    """{"mixture": ...}: a learned prior in the "prior" collection's format (cvae/model/prior.py),
    written after training so the sampler, `cvae eval` and the service read it as they read the
    fitted mixture."""
    return {"mixture": learned_prior.as_mixture(model.apply(variables, method="prior_mixture"))}


def _prior_of(model) -> str:
    return model.prior if isinstance(model, hierarchical.LadderCVAE) else model.config.prior


def _floored(kl_per_dim_mean: jax.Array, free_bits: float) -> jax.Array:
    return jnp.maximum(kl_per_dim_mean, free_bits) if free_bits > 0 else kl_per_dim_mean


def elbo_terms(model, variables: dict, *, images, labels, noise, likelihood: str,
               free_bits: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(reconstruction mean, KL mean, the KL as the loss counts it: floored by free bits)."""
    log_prior = learned_log_prior(model, variables)
    if isinstance(model, hierarchical.LadderCVAE):
        out = model.apply(variables, images, labels, noise[0])
        rec = reconstruction(out.logits, images, likelihood)
        kls = hierarchical.layer_kls(out)
        per_dim = [k.mean(axis=0) for k in (kls if log_prior is None else kls[:-1])]
        kl = sum(k.sum(axis=-1) for k in kls[:len(per_dim)])
        counted = sum(_floored(k, free_bits).sum() for k in per_dim)
        if log_prior is not None:
            top = out.layers[-1]
            sampled = obj.gaussian_log_density(top.z, top.q_mean, top.q_logvar) - log_prior(
                top.z, labels)
            kl = kl + sampled
            counted = counted + jnp.maximum(sampled.mean(), free_bits * top.z.shape[-1])
        return rec.mean(), kl.mean(), counted
    mean, logvar = model.apply(variables, images, labels, method="encode")
    z = obj.gaussian_draws(mean, logvar, noise[0])
    rec = reconstruction(model.apply(variables, z, labels, method="decode"), images, likelihood)
    if log_prior is None:
        per_dim = kl_per_dimension(mean, logvar)
        return rec.mean(), per_dim.sum(-1).mean(), _floored(per_dim.mean(0), free_bits).sum()
    kl = (obj.gaussian_log_density(z, mean, logvar) - log_prior(z, labels)).mean()
    return rec.mean(), kl, jnp.maximum(kl, free_bits * z.shape[-1])


def elbo_per_example(model, variables: dict, *, images, labels, noise, likelihood: str) -> dict:
    """One draw's ELBO terms per example, for validation and `cvae eval`: {"reconstruction"
    f32[B], "kl" f32[B], "kl_per_dim" f32[B, D]}. kl_per_dim holds the analytic KL of every
    dimension against its layer's prior; a learned prior's dimensions have no per-dimension KL
    (their share of "kl" is the one-draw estimate), and count zero there."""
    log_prior = learned_log_prior(model, variables)
    if isinstance(model, hierarchical.LadderCVAE):
        out = model.apply(variables, images, labels, noise[0])
        kls = list(hierarchical.layer_kls(out))
        kl = sum(k.sum(-1) for k in kls)
        if log_prior is not None:
            top = out.layers[-1]
            kl = kl - kls[-1].sum(-1) + obj.gaussian_log_density(
                top.z, top.q_mean, top.q_logvar) - log_prior(top.z, labels)
            kls[-1] = jnp.zeros_like(kls[-1])
        return {"reconstruction": reconstruction(out.logits, images, likelihood), "kl": kl,
                "kl_per_dim": model.join(kls)}
    mean, logvar = model.apply(variables, images, labels, method="encode")
    z = obj.gaussian_draws(mean, logvar, noise[0])
    rec = reconstruction(model.apply(variables, z, labels, method="decode"), images, likelihood)
    per_dim = kl_per_dimension(mean, logvar)
    if log_prior is None:
        return {"reconstruction": rec, "kl": per_dim.sum(-1), "kl_per_dim": per_dim}
    return {"reconstruction": rec, "kl_per_dim": jnp.zeros_like(per_dim),
            "kl": obj.gaussian_log_density(z, mean, logvar) - log_prior(z, labels)}


def weight_functions(model, variables: dict, *, images, labels, noise, likelihood: str,
                     kl_weight) -> tuple[Callable, Callable, Callable]:
    """(sample_fn, log_q_fn, log_joint_fn) of params, as cvae/model/objectives.py wants them:
    log w = log_joint - log_q = log p(x|z,y) + beta * (log p(z|y) - log q(z|x,y))."""

    def with_params(params):
        return {**variables, "params": params}

    if isinstance(model, hierarchical.LadderCVAE):
        def sample_fn(params):
            out = model.apply(with_params(params), images, labels, noise)
            return model.join([t.z for t in out.layers])

        def scored(params, z):
            return model.apply(with_params(params), images, labels, z, method="score")

        def log_q_fn(params, z):
            return kl_weight * hierarchical.log_q(scored(params, z))

        def log_joint_fn(params, z):
            out = scored(params, z)
            log_px = -reconstruction(out.logits, jnp.broadcast_to(images, out.logits.shape),
                                     likelihood)
            log_prior = learned_log_prior(model, with_params(params))
            return log_px + kl_weight * hierarchical.log_p(out, labels, log_prior)

        return sample_fn, log_q_fn, log_joint_fn

    def posterior(params):
        return model.apply(with_params(params), images, labels, method="encode")

    def sample_fn(params):
        return obj.gaussian_draws(*posterior(params), noise)

    def log_q_fn(params, z):
        return kl_weight * obj.gaussian_log_density(z, *posterior(params))

    def log_joint_fn(params, z):
        k, b = z.shape[:2]
        logits = model.apply(with_params(params), z.reshape(k * b, -1), jnp.tile(labels, k),
                             method="decode")
        log_px = -reconstruction(logits, jnp.tile(images, (k, 1)), likelihood).reshape(k, b)
        log_prior = learned_log_prior(model, with_params(params))
        log_pz = (obj.gaussian_log_density(z, 0.0, jnp.zeros_like(z)) if log_prior is None
                  else log_prior(z, labels))
        return log_px + kl_weight * log_pz

    return sample_fn, log_q_fn, log_joint_fn


def lever_loss(model, variables: dict, *, images, labels, noise, config: Config, kl_weight
               ) -> tuple[jax.Array, dict]:
    """-> (loss, terms) of one batch under the config's objective (module docstring)."""
    if config.objective == "elbo":
        rec, kl, counted = elbo_terms(model, variables, images=images, labels=labels,
                                      noise=noise, likelihood=config.likelihood,
                                      free_bits=config.free_bits)
        loss = rec + kl_weight * counted
        return loss, {"reconstruction": rec, "kl": kl, "loss": loss}
    fns = weight_functions(model, variables, images=images, labels=labels, noise=noise,
                           likelihood=config.likelihood, kl_weight=kl_weight)
    if config.objective == "iwae":
        bound = obj.iwae_bound(obj.iwae_log_weights(variables["params"], fns))
    else:
        bound = obj.dreg_surrogate(*obj.dreg_log_weights(variables["params"], fns))
    loss = -bound.mean()
    # The first draw's ELBO terms, for the metrics only (one more pass over B rows, no gradient).
    rec, kl, _ = elbo_terms(model, jax.lax.stop_gradient(variables), images=images,
                            labels=labels, noise=noise[:1], likelihood=config.likelihood,
                            free_bits=0.0)
    return loss, {"reconstruction": rec, "kl": kl, "loss": loss, "bound": bound.mean()}
