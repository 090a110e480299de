"""Dynamic binarisation: grey images read as the Bernoulli likelihood's binary data.

Each pixel becomes 1 with probability its intensity, x ~ Bernoulli(intensity), drawn afresh at
every use (Salakhutdinov & Murray 2008): the train step, the evaluation, the IWAE bounds and the
prior's fit all read MNIST this way, through `binarize`.
"""

from __future__ import annotations

import jax

from cvae.config import components
from cvae.config.sections import Config


@jax.jit
def binarize(key: jax.Array, images: jax.Array) -> jax.Array:
    """Intensities float32[...] in [0, 1] -> a draw of x ~ Bernoulli(intensity), 0.0 or 1.0."""
    return jax.random.bernoulli(key, images).astype(images.dtype)


def scores_levels(likelihood: str) -> bool:
    """Whether the bounds and the prior's fit read the images' 8-bit levels as they are (the
    discretised logistic, a density over those levels) rather than a binarised draw (the
    Bernoulli's binary data, and the Gaussian's figures, measured the same way)."""
    return components.component("likelihood", likelihood).scores_levels


def maybe_binarize(key: jax.Array, images: jax.Array, config: Config) -> jax.Array:
    """`binarize` when the run models binary pixels (Bernoulli likelihood, dynamic
    binarisation); otherwise the intensities as they are."""
    if config.likelihood.component.binarizes(config.likelihood.options):
        return binarize(key, images)
    return images
