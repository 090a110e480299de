"""Importance-weighted objectives and Bayes-rule classification, as pure functions of log weights.

For an image x, its label y and K reparameterised draws z_k ~ q(z | x, y), the log weights are

    log w_k = log p(x | z_k, y) + log p(z_k | y) - log q(z_k | x, y),        f32[K, B]

and the importance-weighted bound (Burda et al. 2016) is IWAE_K = logsumexp_k log w_k - log K.
K = 1 is the single-sample ELBO; the bound tightens in expectation as K grows.

Gradients. Maximising IWAE_K with its plain gradient starves the encoder as K grows (its
gradient's signal-to-noise ratio falls like 1/sqrt(K), Rainforth et al. 2018). The doubly
reparameterised gradient (DReG, Tucker et al. 2019) is unbiased for the same bound and keeps it:
with w~ = softmax_k(log w) held constant,

    encoder (phi):         sum_k w~_k^2  d log w_k / d z_k  d z_k / d phi
    decoder, prior (theta): sum_k w~_k    d log w_k / d theta            (z_k held constant)

`dreg_log_weights` evaluates log w twice, once for each path (the encoder path with the model's
parameters frozen and q's density evaluated with frozen parameters, so only z_k carries phi;
the model path with z_k frozen), and `dreg_surrogate` weighs them so that one `jax.grad` gives
each parameter its own part. Parameters used in both roles (a VampPrior's encoder, a ladder
VAE's top-down network) get the sum of both parts, which is the chain rule over the two uses.

Bayes' rule: a model trained with every label reads a digit as argmax_y log p(x | y) (a uniform
p(y)), each label's log p(x | y) bounded by IWAE_K, all ten labels in one call.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from cvae.config import NUM_CLASSES
from cvae.model.losses import reconstruction

LOG_2PI = math.log(2.0 * math.pi)
Params = Any  # a pytree of parameters (Flax's params collection, or any other)


def gaussian_log_density(z: jax.Array, mean: jax.Array, logvar: jax.Array) -> jax.Array:
    """log N(z; mean, diag(exp(logvar))), summed over the last axis (broadcasting the rest)."""
    return -0.5 * jnp.sum(LOG_2PI + logvar + jnp.square(z - mean) * jnp.exp(-logvar), axis=-1)


def gaussian_draws(mean: jax.Array, logvar: jax.Array, noise: jax.Array) -> jax.Array:
    """z_k = mean + sigma * noise_k: mean, logvar f32[B, L], noise f32[K, B, L] -> f32[K, B, L]."""
    return mean + jnp.exp(0.5 * logvar) * noise


def iwae_bound(log_weights: jax.Array) -> jax.Array:
    """logsumexp_k log w_k - log K: f32[K, B] -> f32[B]. K = 1 gives log w itself (the ELBO's
    single-sample estimate)."""
    return jax.nn.logsumexp(log_weights, axis=0) - math.log(log_weights.shape[0])


def normalized_weights(log_weights: jax.Array) -> jax.Array:
    """w~ = softmax over the K samples, held constant: f32[K, B] -> f32[K, B]."""
    return jax.lax.stop_gradient(jax.nn.softmax(log_weights, axis=0))


def iwae_log_weights(params: Params, fns: tuple[Callable, Callable, Callable]) -> jax.Array:
    """log w f32[K, B] with every gradient path open (the plain IWAE gradient).

    fns = (sample_fn, log_q_fn, log_joint_fn): sample_fn(params) -> z, reparameterised draws
    (any pytree, leading axes [K, B]); log_q_fn(params, z) -> log q(z | x, y) f32[K, B];
    log_joint_fn(params, z) -> log p(x, z | y) f32[K, B]. Each closes over its images and
    labels.
    """
    sample_fn, log_q_fn, log_joint_fn = fns
    z = sample_fn(params)
    return log_joint_fn(params, z) - log_q_fn(params, z)


def dreg_log_weights(params: Params, fns: tuple[Callable, Callable, Callable]
                     ) -> tuple[jax.Array, jax.Array]:
    """(encoder path, model path): the same values of log w f32[K, B], with different gradients.

    Encoder path: z_k = sample_fn(params) keeps its reparameterised gradient; p and q are
    evaluated with frozen parameters, so the only way to the parameters is through z_k. Model
    path: z_k frozen, p evaluated with live parameters (q's density has no live parameters: its
    score term is what DReG removes). Arguments as `iwae_log_weights`.
    """
    sample_fn, log_q_fn, log_joint_fn = fns
    z = sample_fn(params)
    frozen = jax.lax.stop_gradient(params)
    encoder_path = log_joint_fn(frozen, z) - log_q_fn(frozen, z)
    fixed = jax.lax.stop_gradient(z)
    model_path = log_joint_fn(params, fixed) - log_q_fn(frozen, fixed)
    return encoder_path, model_path


def dreg_surrogate(encoder_path: jax.Array, model_path: jax.Array) -> jax.Array:
    """f32[B] whose value is IWAE_K and whose gradient is DReG's (module docstring).

    encoder_path, model_path: `dreg_log_weights`' f32[K, B]. The surrogate
    sum_k sg(w~_k^2) log w_k (encoder path) + sum_k sg(w~_k) log w_k (model path) is added as
    (surrogate - sg(surrogate)), which is zero, to the bound's constant value.
    """
    weights = normalized_weights(model_path)
    surrogate = (jnp.sum(jnp.square(weights) * encoder_path, axis=0)
                 + jnp.sum(weights * model_path, axis=0))
    bound = iwae_bound(jax.lax.stop_gradient(model_path))
    return bound + surrogate - jax.lax.stop_gradient(surrogate)


def model_log_weights(model, variables: dict, *, images: jax.Array, labels: jax.Array,
                      noise: jax.Array, likelihood: str = "bernoulli") -> jax.Array:
    """log w f32[K, B] of a one-latent CVAE (`encode`, `decode`, `log_prior` methods) for given
    noise f32[K, B, L]: the encoder runs once, the decoder on all K * B draws in one call."""
    mean, logvar = model.apply(variables, images, labels, method="encode")
    z = gaussian_draws(mean, logvar, noise)
    k, b = noise.shape[:2]
    flat_z, flat_labels = z.reshape(k * b, -1), jnp.tile(labels, k)
    logits = model.apply(variables, flat_z, flat_labels, method="decode")
    log_px = -reconstruction(logits, jnp.tile(images, (k, 1)), likelihood)
    log_pz = model.apply(variables, flat_z, flat_labels, method="log_prior")
    return (log_px + log_pz).reshape(k, b) - gaussian_log_density(z, mean, logvar)


def per_label_bounds(log_weights_fn: Callable, images: jax.Array, noise: jax.Array
                     ) -> jax.Array:
    """IWAE_K bound on log p(x | y) for every label y: f32[B, 10], in one call.

    log_weights_fn(images f32[R, ...], labels i32[R], noise f32[K, R, ...]) -> f32[K, R];
    images f32[B, ...]; noise f32[K, B, ...] is shared by the ten labels of an image (common
    random numbers: the labels' bounds differ by the model, not by the draws). The labels take
    their turn in a compiled loop (`lax.map`), so the memory is one label's K x B decoder rows,
    not ten labels': all ten at once, a convolutional decoder's maps for a block of 1,024
    digits took about 6 GB of scratch, and the sampler's start-up ran out of memory.
    """
    b = images.shape[0]

    def one_label(label):
        return iwae_bound(log_weights_fn(images, jnp.full((b,), label, jnp.int32), noise))

    return jax.lax.map(one_label, jnp.arange(NUM_CLASSES, dtype=jnp.int32)).T


def bayes_classify(label_bounds: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Bayes' rule under a uniform p(y): bounds f32[B, 10] -> (argmax_y i32[B], p(y | x)
    f32[B, 10], the bounds normalised over the ten labels)."""
    return (jnp.argmax(label_bounds, axis=-1).astype(jnp.int32),
            jax.nn.softmax(label_bounds, axis=-1))
