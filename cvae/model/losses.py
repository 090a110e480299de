"""The VAE objective in nats: per-example terms, and the one loss training and evaluation share.

Per-example terms let evaluation weight batches of unequal size exactly. Loss = reconstruction
+ kl_weight * KL, where the KL may be floored per latent dimension ("free bits") so that no
dimension is pushed to carry nothing. `objective` combines mean terms into the loss; the train
step applies it to a batch's means, evaluation to the means over the whole evaluated set.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from cvae.model.networks import pixel_means


def reconstruction(logits: jax.Array, targets: jax.Array, likelihood: str) -> jax.Array:
    """-log p(x | z, y) per example. logits, targets: float32[B, 784] -> float32[B].

    bernoulli: sigmoid cross-entropy (exact negative log-likelihood for binary targets).
    gaussian: the seed's summed `optax.l2_loss` (0.5 * squared error) of sigmoid means.
    """
    if likelihood == "bernoulli":
        per_pixel = optax.sigmoid_binary_cross_entropy(logits, targets)
    elif likelihood == "gaussian":
        per_pixel = optax.l2_loss(pixel_means(logits), targets)
    else:
        raise ValueError(f"likelihood={likelihood!r}: allowed bernoulli, gaussian")
    return per_pixel.sum(axis=-1)


def kl_per_dimension(mean: jax.Array, logvar: jax.Array) -> jax.Array:
    """KL(N(mean, exp(logvar)) || N(0, 1)) per latent dimension: float32[B, L]."""
    return 0.5 * (jnp.exp(logvar) + jnp.square(mean) - 1.0 - logvar)


def kl_divergence(mean: jax.Array, logvar: jax.Array) -> jax.Array:
    """Total KL per example: float32[B]."""
    return kl_per_dimension(mean, logvar).sum(axis=-1)


def objective(reconstruction_mean, kl_mean, kl_per_dim_mean, *, kl_weight,
              free_bits: float = 0.0):
    """The loss from mean terms: reconstruction + kl_weight * KL.

    reconstruction_mean, kl_mean: scalars; kl_per_dim_mean: float32[L], the mean KL of each
    latent dimension. With free bits, each dimension's mean KL is floored at `free_bits` nats
    before summing; without, the KL is `kl_mean` as it is.
    """
    if free_bits > 0:
        kl_mean = jnp.maximum(kl_per_dim_mean, free_bits).sum(axis=-1)
    return reconstruction_mean + kl_weight * kl_mean


def vae_loss(logits, targets, *, mean, logvar, likelihood: str, kl_weight, free_bits: float = 0.0):
    """Batch-mean loss and its terms. Returns (loss, {"reconstruction", "kl", "loss"}).

    "kl" is the unweighted, unfloored KL; "loss" is what the gradient is taken of.
    """
    rec = reconstruction(logits, targets, likelihood).mean()
    kl = kl_divergence(mean, logvar).mean()
    loss = objective(rec, kl, kl_per_dimension(mean, logvar).mean(axis=0), kl_weight=kl_weight,
                     free_bits=free_bits)
    return loss, {"reconstruction": rec, "kl": kl, "loss": loss}
