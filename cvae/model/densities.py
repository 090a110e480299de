"""The densities every model family and objective shares, each written once (in nats).

Latent Gaussians are diagonal, given by (mean, logvar); pixels are Bernoulli (sigmoid
cross-entropy, the exact negative log-likelihood of binary targets) or the baseline's Gaussian
(the summed half squared error of sigmoid means).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

LOG_2PI = math.log(2.0 * math.pi)


def gaussian_log_density(z: jax.Array, mean, logvar) -> jax.Array:
    """log N(z; mean, diag(exp(logvar))), summed over the last axis (the rest broadcast)."""
    return -0.5 * jnp.sum(LOG_2PI + logvar + jnp.square(z - mean) * jnp.exp(-logvar), axis=-1)


def standard_log_density(z: jax.Array) -> jax.Array:
    """log N(z; 0, I), summed over the last axis."""
    return -0.5 * jnp.sum(jnp.square(z) + LOG_2PI, axis=-1)


def kl_per_dimension(mean: jax.Array, logvar: jax.Array) -> jax.Array:
    """KL(N(mean, exp(logvar)) || N(0, 1)) per latent dimension, same shape as mean."""
    return 0.5 * (jnp.exp(logvar) + jnp.square(mean) - 1.0 - logvar)


def gaussian_kl(q: tuple, p: tuple) -> jax.Array:
    """KL(N(q) || N(p)) per dimension between diagonal Gaussians; q, p: (mean, logvar)."""
    (q_mean, q_logvar), (p_mean, p_logvar) = q, p
    return 0.5 * (p_logvar - q_logvar - 1.0
                  + (jnp.exp(q_logvar) + jnp.square(q_mean - p_mean)) * jnp.exp(-p_logvar))


def pixel_means(logits: jax.Array, sharpness: float = 1.0) -> jax.Array:
    """Decoder logits -> pixel intensities in [0, 1]: the expected ones at sharpness 1, the
    Bernoulli decoder at temperature 1/s otherwise (rendering only)."""
    return jax.nn.sigmoid(sharpness * logits)


def reconstruction(logits: jax.Array, targets: jax.Array, likelihood: str) -> jax.Array:
    """-log p(x | z, y) per example: logits, targets f32[..., P] -> f32[...]."""
    if likelihood == "bernoulli":
        per_pixel = optax.sigmoid_binary_cross_entropy(logits, targets)
    elif likelihood == "gaussian":
        per_pixel = optax.l2_loss(pixel_means(logits), targets)
    else:
        raise ValueError(f"likelihood={likelihood!r}: allowed bernoulli, gaussian")
    return per_pixel.sum(axis=-1)
