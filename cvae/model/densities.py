"""The densities every model family and objective shares, each written once (in nats).

Latent Gaussians are diagonal, given by (mean, logvar); pixels are Bernoulli (sigmoid
cross-entropy, the exact negative log-likelihood of binary targets), the baseline's Gaussian
(the summed half squared error of sigmoid means), or a discretised logistic over the 256 levels
of 8-bit data (Salimans et al. 2017, PixelCNN++; Kingma et al. 2016, IAF): one logistic per
value, its mass on each level the CDF's difference across the level's bin, the two edge bins
reaching to -inf and +inf, so the 256 masses sum to 1.

The decoder's outputs per image are `output_channels(likelihood, C)` a pixel location: one
logit a value; for the logistic the means f32[..., P] followed by the log-scales f32[..., P]
(both in units of intensity, [0, 1] = levels 0..255); for the logistic mixture each location's
weights, means, scales and couplings together. Which likelihood does what
is its registered class's to say (`cvae.model.likelihoods`); the functions here take its name.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from cvae.config import components
from cvae.data.pixels import MAX_LEVEL

LOG_2PI = math.log(2.0 * math.pi)
_HALF_BIN = 0.5 / MAX_LEVEL  # half a level's bin, in intensity units
# The smallest log-scale the logistic takes (PixelCNN++'s -7 on its [-1, 1] scale): a scale far
# below one bin would only sharpen a mass that is already 1.
_MIN_LOG_SCALE = -7.0 - math.log(2.0)
# Below this mass the CDF difference loses its digits in float32; the density at the bin's
# centre times its width is used instead (PixelCNN++'s rule).
_MIN_BIN_MASS = 1e-5


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


def _likelihood(likelihood):
    """(the registered class, its options) of a likelihood section or a likelihood's name (its
    default options)."""
    if isinstance(likelihood, str):
        cls = components.component("likelihood", likelihood)
        return cls, cls.Options()
    return likelihood.component, likelihood.options


def output_channels(likelihood, channels: int) -> int:
    """Decoder outputs per pixel location of an image with `channels` channels."""
    cls, options = _likelihood(likelihood)
    return cls.output_channels(options, channels)


def pixel_means(logits: jax.Array, sharpness: float = 1.0, *, likelihood="bernoulli",
                channels: int = 1) -> jax.Array:
    """Decoder outputs f32[..., M * H * W] -> pixel intensities f32[..., P] in [0, 1], as the
    likelihood (a section, or a name) renders them at `sharpness` (`cvae.model.likelihoods`)."""
    cls, options = _likelihood(likelihood)
    return cls.means(logits, sharpness, options=options, channels=channels)


def logistic_parameters(outputs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Decoder outputs f32[..., 2P] -> (means, log-scales floored at `_MIN_LOG_SCALE`)."""
    means, log_scales = jnp.split(outputs, 2, axis=-1)
    return means, jnp.maximum(log_scales, _MIN_LOG_SCALE)


def discretized_logistic_log_mass(targets: jax.Array, means: jax.Array,
                                  log_scales: jax.Array) -> jax.Array:
    """log P(level) per value: targets = level / 255 in [0, 1], shapes broadcast.

    P = sigmoid((x + h - mu) / s) - sigmoid((x - h - mu) / s), h half a bin; level 0 takes all
    the mass below its upper edge, level 255 all above its lower edge."""
    centred = targets - means
    inverse_scale = jnp.exp(-log_scales)
    upper = inverse_scale * (centred + _HALF_BIN)
    lower = inverse_scale * (centred - _HALF_BIN)
    log_cdf_upper = jax.nn.log_sigmoid(upper)  # level 0: log P(v < x + h)
    log_survival_lower = jax.nn.log_sigmoid(-lower)  # level 255: log P(v > x - h)
    mass = jax.nn.sigmoid(upper) - jax.nn.sigmoid(lower)
    middle = inverse_scale * centred
    log_density_mid = middle - log_scales - 2.0 * jax.nn.softplus(middle)
    interior = jnp.where(mass > _MIN_BIN_MASS, jnp.log(jnp.maximum(mass, _MIN_BIN_MASS)),
                         log_density_mid + math.log(2.0 * _HALF_BIN))
    level = jnp.round(targets * MAX_LEVEL)
    return jnp.where(level <= 0, log_cdf_upper,
                     jnp.where(level >= MAX_LEVEL, log_survival_lower, interior))


def reconstruction(logits: jax.Array, targets: jax.Array, likelihood, *,
                   channels: int = 1) -> jax.Array:
    """-log p(x | z, y) per example: decoder outputs f32[..., M * H * W] and targets
    f32[..., P] -> f32[...], under the likelihood (a section, or a name). The logistics' are in
    nats of the 8-bit levels themselves."""
    cls, options = _likelihood(likelihood)
    return cls.negative_log_likelihood(logits, targets, options=options,
                                       channels=channels).sum(axis=-1)


def bits_per_dim(nats, values: int):
    """Nats per image -> bits per value: nats / (values * ln 2), values = H * W * C."""
    return nats / (values * math.log(2.0))
