"""The likelihoods p(x|z,y) over the pixels, registered by name (`cvae.config.components`), each
a class with its own options and one interface, so no caller asks which likelihood it holds:

- `outputs_per_value`: decoder outputs per image value (a logit, or a mean and a log-scale);
- `negative_log_likelihood(outputs, targets)`: -log p(x|z,y) per value, in nats;
- `means(outputs, sharpness)`: the pixel intensities an image is rendered with;
- `binarizes(options)`: whether training reads each image as a fresh binary draw;
- `scores_levels`: whether the bounds and the prior's fit read the 8-bit levels as they are,
  rather than a binarised draw;
- `bounded`: whether it is a density of the data, so `cvae eval` reports -log p(x) for it.

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
    outputs_per_value = 1
    scores_levels = False
    bounded = True

    @staticmethod
    def negative_log_likelihood(outputs: jax.Array, targets: jax.Array) -> jax.Array:
        return optax.sigmoid_binary_cross_entropy(outputs, targets)

    @staticmethod
    def means(outputs: jax.Array, sharpness: float) -> jax.Array:
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
    def negative_log_likelihood(outputs: jax.Array, targets: jax.Array) -> jax.Array:
        return optax.l2_loss(jax.nn.sigmoid(outputs), targets)

    @staticmethod
    def binarizes(options) -> bool:
        return False


class Logistic:
    """A discretised logistic over the 256 levels of 8-bit data (grey-level, colour): per value
    a mean and a log-scale (docs/model.md)."""

    Options = NoOptions
    outputs_per_value = 2
    scores_levels = True
    bounded = True

    @staticmethod
    def negative_log_likelihood(outputs: jax.Array, targets: jax.Array) -> jax.Array:
        return -densities.discretized_logistic_log_mass(
            targets, *densities.logistic_parameters(outputs))

    @staticmethod
    def means(outputs: jax.Array, sharpness: float) -> jax.Array:
        """Each value's mean, clipped to [0, 1] (the mode of its 256 levels but at the edges,
        and a draw's expectation; sharpness does not apply)."""
        return jnp.clip(densities.logistic_parameters(outputs)[0], 0.0, 1.0)

    @staticmethod
    def binarizes(options) -> bool:
        return False
