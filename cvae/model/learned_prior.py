"""Priors p(z | y) learnt with the model: a VampPrior with per-class pseudo-inputs, and a
per-class Gaussian mixture with free parameters.

Why: training today pulls every code towards N(0, I), and a mixture is fitted to the codes only
afterwards (cvae/model/prior.py). A prior trained jointly lets the KL pull codes towards where
the prior is, not towards the origin, which buys likelihood (VampPrior: 1.2 nats on MNIST over
N(0, I) for a one-layer VAE, Tomczak and Welling 2018, Table 2) and samples from where the
decoder was trained.

- VampPrior (Tomczak and Welling 2018), class-conditional: p(z | y) = (1/K) sum_k q(z | u_yk, y),
  the encoder's own posterior at K learnt pseudo-inputs u_yk in (0, 1)^P per class (P = H * W
  * C; the sigmoid of free parameters). Its components move with the encoder, so they are
  computed from the current parameters at each use (`vamp_components`: classes x K encoder rows).
- Learned mixture: per class, K diagonal Gaussians with free means, log-variances (soft-clamped,
  as the encoder's) and mixture logits.

Both are diagonal Gaussian mixtures per class, described by (log_weights f32[C, K],
means f32[C, K, L], logvars f32[C, K, L]). `diagonal_log_density` scores z under one (a
logsumexp over components). `as_mixture` writes one in the format of cvae/model/prior.py's
fitted mixture, so `prior.sample` (one noise vector per sample, the component read from the
fractional part of 1000 * noise[0]), `prior.log_density` and the class transport take it as
they are: the sampler's contract does not change.
"""

from __future__ import annotations

import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from cvae.model import prior as prior_lib
from cvae.model.densities import gaussian_log_density

# Tomczak and Welling initialise MNIST pseudo-inputs near 0.05 (most of a digit is background).
PSEUDO_INPUT_MEAN, PSEUDO_INPUT_STD = 0.05, 0.01


class PseudoInputs(nn.Module):
    """The VampPrior's pseudo-inputs u: f32[classes, per_class, pixels] in (0, 1)."""

    per_class: int
    pixels: int
    num_classes: int

    @nn.compact
    def __call__(self) -> jax.Array:
        def init(key, shape):  # pixel values ~ N(0.05, 0.01), stored as their logits
            pixels = PSEUDO_INPUT_MEAN + PSEUDO_INPUT_STD * jax.random.normal(key, shape)
            return jax.scipy.special.logit(jnp.clip(pixels, 1e-3, 1 - 1e-3))

        logits = self.param("logits", init, (self.num_classes, self.per_class, self.pixels))
        return jax.nn.sigmoid(logits)


def vamp_components(encode_fn: Callable, pseudo_inputs: jax.Array
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The VampPrior as a mixture: (log_weights f32[C, K], means f32[C, K, L], logvars).

    encode_fn(images f32[N, P], labels i32[N]) -> (mean, logvar) f32[N, L], the model's
    q(z | x, y); pseudo_inputs f32[C, K, P]. Class y's components are q(z | u_yk, y), weighted
    equally. One encoder call of C * K rows.
    """
    classes, per_class, pixels = pseudo_inputs.shape
    labels = jnp.repeat(jnp.arange(classes, dtype=jnp.int32), per_class)
    mean, logvar = encode_fn(pseudo_inputs.reshape(classes * per_class, pixels), labels)
    log_weights = jnp.full((classes, per_class), -math.log(per_class), mean.dtype)
    return (log_weights, mean.reshape(classes, per_class, -1),
            logvar.reshape(classes, per_class, -1))


class GaussianMixturePrior(nn.Module):
    """A per-class mixture of `components` diagonal Gaussians over z, every part learnt.

    -> (log_weights f32[C, K], means f32[C, K, L], logvars f32[C, K, L]). Means start spread
    as N(0, I) draws (distinct components from the first step), log-variances at 0, weights
    equal.
    """

    components: int
    latent_dim: int
    num_classes: int
    logvar_bound: float = 8.0

    @nn.compact
    def __call__(self):
        shape = (self.num_classes, self.components, self.latent_dim)
        means = self.param("means", nn.initializers.normal(1.0), shape)
        raw_logvars = self.param("logvars", nn.initializers.zeros, shape)
        logits = self.param("logits", nn.initializers.zeros, shape[:2])
        logvars = self.logvar_bound * jnp.tanh(raw_logvars / self.logvar_bound)
        return jax.nn.log_softmax(logits, axis=-1), means, logvars


def diagonal_log_density(mixture: tuple[jax.Array, jax.Array, jax.Array], z: jax.Array,
                         labels: jax.Array) -> jax.Array:
    """log p(z | y) = logsumexp_k [log pi_yk + log N(z; mean_yk, exp(logvar_yk))].

    mixture: (log_weights, means, logvars) as above; z f32[..., B, L] (leading axes, such as
    importance samples, broadcast); labels i32[B] -> f32[..., B].
    """
    log_weights, means, logvars = mixture
    log_normal = gaussian_log_density(z[..., None, :], means[labels], logvars[labels])
    return jax.nn.logsumexp(log_weights[labels] + log_normal, axis=-1)


def as_mixture(mixture: tuple[jax.Array, jax.Array, jax.Array]) -> dict:
    """The mixture in cvae/model/prior.py's format: {"weights" f32[C, K], "means" f32[C, K, L],
    "scale_tril" f32[C, K, L, L]} (diagonal factors), for its `sample` and `log_density`."""
    log_weights, means, logvars = mixture
    scale = jnp.exp(0.5 * logvars)
    return {"weights": jnp.exp(log_weights), "means": means,
            "scale_tril": scale[..., :, None] * jnp.eye(means.shape[-1], dtype=means.dtype)}


def sample(mixture: tuple[jax.Array, jax.Array, jax.Array], noise: jax.Array,
           labels: jax.Array) -> jax.Array:
    """z for each row: noise f32[B, L] ~ N(0, t^2 I), labels i32[B] -> f32[B, L], by
    `prior.sample`'s rule (component from frac(1000 * noise[0]), then mean + sigma * noise):
    deterministic in the noise, and temperature narrows the components, not the choice."""
    return prior_lib.sample(as_mixture(mixture), noise, labels)
