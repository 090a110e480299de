"""The likelihoods p(x|z,y) over the pixels, registered by name (`cvae.config.components`), each
a class with its own options and one interface, so no caller asks which likelihood it holds:

- `output_channels(options, channels)`: decoder outputs per pixel location of an image with
  `channels` channels (a logit a value; a mean and a log-scale a value; a mixture's weights,
  means, scales and channel couplings); `parameter_major`: whether those outputs are laid out
  each parameter's image together ([k, H, W, C]) rather than location by location
  ([H, W, k]);
- `negative_log_likelihood(outputs, targets, options=, channels=)`: -log p(x|z,y) per value
  (or per location), in nats;
- `means(outputs, sharpness, options=, channels=)`: the pixel intensities an image is
  rendered with;
- `binarizes(options)`: whether training reads each image as a fresh binary draw;
- `scores_levels`: whether the bounds and the prior's fit read the 8-bit levels as they are,
  rather than a binarised draw;
- `bounded`: whether it is a density of the data, so `cvae eval` reports -log p(x) for it;
- `blends_modes`: whether its means blend each pixel's modes (a mixture's), so that rendering
  at a sharpness above 1 draws a pixel from near its likeliest mode instead.

The densities themselves are `cvae.model.densities`'.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
import optax

from cvae.config.settings import NoOptions, setting
from cvae.model import densities


@dataclasses.dataclass(frozen=True)
class BernoulliOptions:
    binarization: Literal["none", "dynamic"] = setting(
        "dynamic", "Resample each pixel ~ Bernoulli(intensity) at every step (dynamic), or use "
                   "the intensities as they are (none).")


class Bernoulli:
    """Binary pixels (nearly binary grey images): sigmoid cross-entropy, the exact negative
    log-likelihood of binary targets."""

    Options = BernoulliOptions
    scores_levels = False
    bounded = True
    parameter_major = False
    blends_modes = False

    @staticmethod
    def output_channels(options, channels: int) -> int:
        return channels

    @staticmethod
    def negative_log_likelihood(outputs: jax.Array, targets: jax.Array, *, options,
                                channels: int) -> jax.Array:
        return optax.sigmoid_binary_cross_entropy(outputs, targets)

    @staticmethod
    def means(outputs: jax.Array, sharpness: float, *, options, channels: int) -> jax.Array:
        """The expected intensities at sharpness 1; the decoder at temperature 1/s otherwise
        (rendering only)."""
        return jax.nn.sigmoid(sharpness * outputs)

    @staticmethod
    def binarizes(options) -> bool:
        return options.binarization == "dynamic"


class Gaussian(Bernoulli):
    """The seed's Gaussian: the summed half squared error of the sigmoid means (not a density
    of 8-bit data, so no -log p(x))."""

    Options = NoOptions
    bounded = False

    @staticmethod
    def negative_log_likelihood(outputs: jax.Array, targets: jax.Array, *, options,
                                channels: int) -> jax.Array:
        return optax.l2_loss(jax.nn.sigmoid(outputs), targets)

    @staticmethod
    def binarizes(options) -> bool:
        return False


class Logistic:
    """A discretised logistic over the 256 levels of 8-bit data (grey-level, colour): per value
    a mean and a log-scale (docs/model.md)."""

    Options = NoOptions
    scores_levels = True
    bounded = True
    parameter_major = True
    blends_modes = False

    @staticmethod
    def output_channels(options, channels: int) -> int:
        return 2 * channels

    @staticmethod
    def negative_log_likelihood(outputs: jax.Array, targets: jax.Array, *, options,
                                channels: int) -> jax.Array:
        return -densities.discretized_logistic_log_mass(
            targets, *densities.logistic_parameters(outputs))

    @staticmethod
    def means(outputs: jax.Array, sharpness: float, *, options, channels: int) -> jax.Array:
        """Each value's mean, clipped to [0, 1] (the mode of its 256 levels but at the edges,
        and a draw's expectation; sharpness does not apply)."""
        return jnp.clip(densities.logistic_parameters(outputs)[0], 0.0, 1.0)

    @staticmethod
    def binarizes(options) -> bool:
        return False


@dataclasses.dataclass(frozen=True)
class MixtureOptions:
    mixture_components: int = setting(
        10, "Logistics in each pixel's mixture (PixelCNN++ uses 10 on CIFAR-10).", low=1,
        high=64)


class LogisticMixture:
    """A mixture of discretised logistics over the 256 levels, per pixel (Salimans et al. 2017,
    PixelCNN++): each component a logistic per channel, a colour image's channels coupled
    (green's mean moves with red's value, blue's with red's and green's)."""

    Options = MixtureOptions
    scores_levels = True
    bounded = True
    parameter_major = False
    blends_modes = True

    @staticmethod
    def binarizes(options) -> bool:
        return False

    @staticmethod
    def output_channels(options, channels: int) -> int:
        return options.mixture_components * (1 + 2 * channels + _couplings(channels))

    @staticmethod
    def negative_log_likelihood(outputs: jax.Array, targets: jax.Array, *, options,
                                channels: int) -> jax.Array:
        """-log p(x) per pixel location, f32[..., H * W]."""
        weights, means, log_scales, coupling = _mixture_parameters(outputs, options, channels)
        values = targets.reshape(*targets.shape[:-1], -1, 1, channels)  # [..., L, 1, C]
        means = _coupled(means, coupling, values)
        log_mass = densities.discretized_logistic_log_mass(values, means, log_scales)
        return -jax.nn.logsumexp(weights + log_mass.sum(axis=-1), axis=-1)

    @staticmethod
    def means(outputs: jax.Array, sharpness: float, *, options, channels: int) -> jax.Array:
        """The mixture's expected intensities at sharpness 1, each channel coupled to the
        components' own means of the channels before it; clipped to [0, 1]. Sharpness s
        weighs the components by their weights to the power s (renormalised): above 1 a pixel
        leans to its likeliest component instead of blending modes into grey (rendering only)."""
        weights, means, _, coupling = _mixture_parameters(outputs, options, channels)
        means = _coupled(means, coupling, jnp.clip(means, 0.0, 1.0))
        mean = jnp.sum(jax.nn.softmax(sharpness * weights, axis=-1)[..., None] * means,
                       axis=-2)
        return jnp.clip(mean, 0.0, 1.0).reshape(*mean.shape[:-2], -1)


def _couplings(channels: int) -> int:
    """Coefficients a component couples its channels with: 3 for RGB, none otherwise."""
    return 3 if channels == 3 else 0


def _mixture_parameters(outputs: jax.Array, options, channels: int):
    """Decoder outputs f32[..., L * M] (location-major) -> log weights f32[..., L, K], means
    and floored log-scales f32[..., L, K, C], couplings f32[..., L, K, 3 or 0] in (-1, 1)."""
    k = options.mixture_components
    per_location = outputs.reshape(*outputs.shape[:-1], -1,
                                   k * (1 + 2 * channels + _couplings(channels)))
    logits, means, log_scales, coupling = jnp.split(
        per_location, [k, k + k * channels, k + 2 * k * channels], axis=-1)
    shape = (*per_location.shape[:-1], k, channels)
    means, log_scales = densities.logistic_parameters(
        jnp.concatenate([means.reshape(shape), log_scales.reshape(shape)], axis=-1))
    coupling = jnp.tanh(coupling.reshape(*per_location.shape[:-1], k, _couplings(channels)))
    return jax.nn.log_softmax(logits, axis=-1), means, log_scales, coupling


def _coupled(means: jax.Array, coupling: jax.Array, values: jax.Array) -> jax.Array:
    """RGB means with green moved by alpha * red and blue by beta * red + gamma * green (the
    values given: the data's when scoring, the means' when rendering); others unchanged."""
    if coupling.shape[-1] == 0:
        return means
    red, green, blue = (means[..., c] for c in range(3))
    x_red, x_green = values[..., 0], values[..., 1]
    green = green + coupling[..., 0] * x_red
    blue = blue + coupling[..., 1] * x_red + coupling[..., 2] * x_green
    return jnp.stack([red, green, blue], axis=-1)
