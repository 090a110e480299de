"""Importance-weighted bounds (Burda et al. 2015) on log p(x | y) and log p(x), in nats.

For one binarised image x and label y, with q = q(z | x, y) and K samples z_k ~ q:

    log p(x | y) >= log (1/K) sum_k p(x | z_k, y) p(z_k) / q(z_k | x, y)

K = 1 is the single-sample ELBO; the bound tightens in expectation as K grows. Sample k's noise
is `normal(fold_in(key, k), [B, L])`, a function of k alone, so a run cut into chunks of K sees
exactly the samples of an unchunked run, and sample 0 is the one `CVAE.__call__` draws from
`fold_in(key, 0)`. Chunks run under `lax.map`, so memory holds one chunk of
[chunk, B, hidden] activations whatever K is. The marginal uses a uniform label prior:
log p(x) = logsumexp_y' [log p(x | y') - log 10].
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from cvae.config import NUM_CLASSES
from cvae.data.pixels import IMAGE_PIXELS, to_unit
from cvae.model.binarization import binarize
from cvae.model.losses import reconstruction
from cvae.model.networks import CVAE

LOG_2PI = math.log(2.0 * math.pi)


def gaussian_log_density(z: jax.Array, mean: jax.Array, logvar: jax.Array) -> jax.Array:
    """log N(z; mean, exp(logvar)) summed over the last axis."""
    return -0.5 * jnp.sum(LOG_2PI + logvar + jnp.square(z - mean) * jnp.exp(-logvar), axis=-1)


def sample_noise(key: jax.Array, index: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """The standard-normal noise of importance sample `index`: depends on (key, index) only."""
    return jax.random.normal(jax.random.fold_in(key, index), shape, jnp.float32)


def log_weights(model: CVAE, variables: dict, *, images: jax.Array, labels: jax.Array,
                key: jax.Array, indices: jax.Array, likelihood: str) -> jax.Array:
    """log w_k = log p(x|z_k,y) + log p(z_k) - log q(z_k|x,y): float32[len(indices), B].

    images: float32[B, 784] (binarised for the Bernoulli likelihood); labels: int32[B].
    """
    mean, logvar = model.apply(variables, images, labels, method=CVAE.encode)

    def one(index):
        z = mean + jnp.exp(0.5 * logvar) * sample_noise(key, index, mean.shape)
        logits = model.apply(variables, z, labels, method=CVAE.decode)
        log_px = -reconstruction(logits, images, likelihood)
        log_pz = model.apply(variables, z, labels, method=CVAE.log_prior)
        return log_px + log_pz - gaussian_log_density(z, mean, logvar)

    return jax.vmap(one)(indices)


def create_iwae_fn(model: CVAE, likelihood: str, num_samples: int, *, chunk: int = 100) -> Callable:
    """Jitted `iwae(variables, images f32[B, 784], labels i32[B], key) -> log p(x|y) bound [B]`.

    The K = num_samples samples are evaluated `chunk` at a time (K is padded up to a multiple of
    the chunk; padded samples get weight zero), so peak memory is set by `chunk`, not K.
    """
    if num_samples < 1 or chunk < 1:
        raise ValueError(f"num_samples={num_samples}, chunk={chunk}: both must be >= 1")
    chunk = min(chunk, num_samples)
    num_chunks = -(-num_samples // chunk)
    indices = jnp.arange(num_chunks * chunk).reshape(num_chunks, chunk)

    @jax.jit
    def iwae(variables, images, labels, key):
        def body(chunk_indices):
            weights = log_weights(model, variables, images=images, labels=labels, key=key,
                                  indices=chunk_indices,
                                  likelihood=likelihood)
            return jnp.where((chunk_indices < num_samples)[:, None], weights, -jnp.inf)

        weights = jax.lax.map(body, indices).reshape(num_chunks * chunk, -1)
        return jax.nn.logsumexp(weights, axis=0) - jnp.log(float(num_samples))

    return iwae


def binarize_levels(key: jax.Array, images_u8) -> jax.Array:
    """uint8 pixels [B, 28, 28] or [B, 784] -> a binarised draw, float32[B, 784]
    (`cvae.model.binarization`)."""
    return binarize(key, to_unit(jnp.asarray(images_u8).reshape(len(images_u8), -1)))


def test_set_bounds(model: CVAE, variables: dict, *, images_u8: np.ndarray, labels: np.ndarray,
                    key: jax.Array, num_samples: int, marginal_samples: int,
                    batch_size: int = 100, chunk: int = 100,
                    likelihood: str = "bernoulli") -> dict[str, np.ndarray]:
    """Per-example bounds on a binarised test set (batch i binarised with fold_in(key, i)).

    Returns {"log_px_given_y": [N] (K = num_samples, true label), "log_px_given_label": [N, 10]
    (the true label's column is the K-sample figure, the others use `marginal_samples`),
    "log_px": [N]} — or without the last two when marginal_samples is 0.
    """
    cond_fn = create_iwae_fn(model, likelihood, num_samples, chunk=chunk)
    other_fn = (create_iwae_fn(model, likelihood, marginal_samples, chunk=chunk)
                if marginal_samples else None)
    binarize_key, sample_key = jax.random.split(key)
    n = len(images_u8)
    conditional, per_label = [], []
    for i, start in enumerate(range(0, n, batch_size)):
        rows = slice(start, min(start + batch_size, n))
        pad = batch_size - (rows.stop - rows.start)
        x = binarize_levels(jax.random.fold_in(binarize_key, i),
                            np.pad(images_u8[rows].reshape(-1, IMAGE_PIXELS), ((0, pad), (0, 0))))
        y = jnp.asarray(np.pad(labels[rows], (0, pad)), jnp.int32)
        batch_key = jax.random.fold_in(sample_key, i)
        cond = np.asarray(cond_fn(variables, x, y, batch_key))[:batch_size - pad]
        conditional.append(cond)
        if other_fn is not None:
            columns = [np.asarray(other_fn(variables, x, jnp.full_like(y, label),
                                           jax.random.fold_in(batch_key, 1 + label)))
                       for label in range(NUM_CLASSES)]
            table = np.stack(columns, axis=1)[:batch_size - pad]
            table[np.arange(len(cond)), labels[rows]] = cond
            per_label.append(table)
    result = {"log_px_given_y": np.concatenate(conditional)}
    if per_label:
        table = np.concatenate(per_label)
        result["log_px_given_label"] = table
        result["log_px"] = marginal_log_likelihood(table)
    return result


def marginal_log_likelihood(log_px_given_label: np.ndarray) -> np.ndarray:
    """log p(x) = logsumexp_y [log p(x|y) + log p(y)] with p(y) = 1/10; float64[N]."""
    table = np.asarray(log_px_given_label, np.float64)
    top = table.max(axis=1, keepdims=True)
    return (top[:, 0] + np.log(np.exp(table - top).sum(axis=1))) - math.log(NUM_CLASSES)


def check_marginal(log_px_given_y: np.ndarray, log_px_given_label: np.ndarray,
                   log_px: np.ndarray, *, tolerance: float = 1e-3) -> dict[str, float | bool]:
    """The two inequalities that hold for every example, given the same per-label estimates:

    -log p(x) <= -log p(x|y) + log 10   (the true label's own share of the sum), and
    -log p(x) >= min_y' -log p(x|y')    (a mean of ten terms is at most their largest).
    """
    upper_gap = float(np.max(-log_px - (-log_px_given_y + math.log(NUM_CLASSES))))
    lower_gap = float(np.max(-log_px_given_label.max(axis=1) - (-log_px)))
    return {"ok": bool(upper_gap <= tolerance and lower_gap <= tolerance),
            "max_upper_violation": upper_gap, "max_lower_violation": lower_gap}
