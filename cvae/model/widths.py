"""The widths of a model's latents, from its config alone (no JAX: the model card reads them).

A code is what `encode` gives and `decode` takes: the posterior the transfer, walks, the fitted
mixture and the class transport work on. The noise is what one sample draws, N(0, t^2 I): the
one-latent CVAE's is its code's width; the ladder VAE's is every layer, top layer first
(cvae/model/hierarchical.py), its first `code_dim` entries the top layer's.
"""

from __future__ import annotations


def layer_dims(config) -> tuple[int, ...]:
    """The stochastic layers' widths, bottom layer first: `latent_dim`, then
    `upper_latent_dim` for each layer above."""
    return (config.latent_dim,) + (config.upper_latent_dim,) * (config.stochastic_layers - 1)


def code_dim(config) -> int:
    """The width of a code: the latent, or the ladder's top layer."""
    return layer_dims(config)[-1]


def noise_dim(config) -> int:
    """The width of one sample's noise: the latent, or every ladder layer."""
    return sum(layer_dims(config))
