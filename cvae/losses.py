"""The VAE objective as pure per-example functions, in nats.

Per-example terms are vmapped over the batch so that evaluation can weight batches of unequal
size exactly. Loss = reconstruction + kl_weight * KL, where the KL may be floored per latent
dimension ("free bits") so that no dimension is pushed to carry nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from cvae.model import pixel_means


def reconstruction(logits: jax.Array, targets: jax.Array, likelihood: str) -> jax.Array:
    """-log p(x | z, y) per example. logits, targets: float32[B, 784] -> float32[B].

    bernoulli: sigmoid cross-entropy (exact negative log-likelihood for binary targets).
    gaussian: the seed's summed `optax.l2_loss` (0.5 * squared error) of sigmoid means.
    """
    if likelihood == "bernoulli":
        per_pixel = optax.sigmoid_binary_cross_entropy(logits, targets)
    elif likelihood == "gaussian":
        per_pixel = optax.l2_loss(pixel_means(logits, likelihood), targets)
    else:
        raise ValueError(f"likelihood={likelihood!r}: allowed bernoulli, gaussian")
    return per_pixel.sum(axis=-1)


def kl_per_dimension(mean: jax.Array, logvar: jax.Array) -> jax.Array:
    """KL(N(mean, exp(logvar)) || N(0, 1)) per latent dimension: float32[B, L]."""
    return 0.5 * (jnp.exp(logvar) + jnp.square(mean) - 1.0 - logvar)


def kl_divergence(mean: jax.Array, logvar: jax.Array) -> jax.Array:
    """Total KL per example: float32[B]."""
    return kl_per_dimension(mean, logvar).sum(axis=-1)


def kl_penalty(mean: jax.Array, logvar: jax.Array, free_bits: float) -> jax.Array:
    """The KL as it enters the loss: per-dimension batch means floored at `free_bits` nats."""
    per_dim = kl_per_dimension(mean, logvar).mean(axis=0)
    return jnp.maximum(per_dim, free_bits).sum()


def vae_loss(logits, targets, mean, logvar, *, likelihood: str, kl_weight, free_bits: float = 0.0):
    """Batch-mean loss and its terms. Returns (loss, {"reconstruction", "kl", "loss"})."""
    rec = reconstruction(logits, targets, likelihood).mean()
    kl = kl_divergence(mean, logvar).mean()
    penalty = kl_penalty(mean, logvar, free_bits) if free_bits > 0 else kl
    loss = rec + kl_weight * penalty
    return loss, {"reconstruction": rec, "kl": kl, "loss": loss}
