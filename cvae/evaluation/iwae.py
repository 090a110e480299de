"""Importance-weighted bounds (Burda et al. 2015) on log p(x | y) and log p(x), in nats, through
each model's own log weights.

For one binarised image x and label y, with q = q(z | x, y) and K samples z_k ~ q:

    log p(x | y) >= log (1/K) sum_k p(x | z_k, y) p(z_k | y) / q(z_k | x, y)

K = 1 is the single-sample ELBO; the bound tightens in expectation as K grows. The log weights
are each model's own (cvae/model/log_weights.py): the one-latent CVAE's, or the ladder VAE's
over all its layers, with the prior the samples are drawn from.

Sample k's noise is `normal(fold_in(key, k), [B, D])` (D the model's noise width: the latent, or
every ladder layer), a function of k alone, so a run cut into chunks of K sees exactly the
samples of an unchunked run, and sample 0 is the one `CVAE.__call__` draws from
`fold_in(key, 0)`. Chunks run under `lax.map`, so memory holds one chunk of activations whatever
K is. The marginal uses a uniform label prior: log p(x) = logsumexp_y' [log p(x | y') - log 10].
`create_label_table_fn` scores all ten labels in one batched pass with common draws (the labels'
bounds differ by the model, not by the noise): the table for the marginal and for Bayes' rule,
argmax_y log p(x | y).
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
from cvae.model.objectives import sampling_log_weights_fn


def sample_noise(key: jax.Array, index: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """The standard-normal noise of importance sample `index`: depends on (key, index) only."""
    return jax.random.normal(jax.random.fold_in(key, index), shape, jnp.float32)


def log_weights(model, variables: dict, *, images: jax.Array, labels: jax.Array,
                key: jax.Array, indices: jax.Array, likelihood: str) -> jax.Array:
    """log w_k for the samples `indices`: float32[len(indices), B].

    images: float32[B, 784] (binarised for the Bernoulli likelihood); labels: int32[B].
    """
    shape = (images.shape[0], model.noise_dim)
    noise = jax.vmap(lambda index: sample_noise(key, index, shape))(indices)
    return sampling_log_weights_fn(model, variables)(images, labels, noise)


def _chunks(num_samples: int, chunk: int) -> tuple[int, jax.Array]:
    if num_samples < 1 or chunk < 1:
        raise ValueError(f"num_samples={num_samples}, chunk={chunk}: both must be >= 1")
    chunk = min(chunk, num_samples)
    num_chunks = -(-num_samples // chunk)
    return num_chunks * chunk, jnp.arange(num_chunks * chunk).reshape(num_chunks, chunk)


def create_iwae_fn(model, likelihood: str, num_samples: int, *, chunk: int = 100) -> Callable:
    """Jitted `iwae(variables, images f32[B, 784], labels i32[B], key) -> log p(x|y) bound [B]`.

    The K = num_samples samples are evaluated `chunk` at a time (K is padded up to a multiple of
    the chunk; padded samples get weight zero), so peak memory is set by `chunk`, not K.
    """
    padded, indices = _chunks(num_samples, chunk)

    @jax.jit
    def iwae(variables, images, labels, key):
        def body(chunk_indices):
            weights = log_weights(model, variables, images=images, labels=labels, key=key,
                                  indices=chunk_indices, likelihood=likelihood)
            return jnp.where((chunk_indices < num_samples)[:, None], weights, -jnp.inf)

        weights = jax.lax.map(body, indices).reshape(padded, -1)
        return jax.nn.logsumexp(weights, axis=0) - jnp.log(float(num_samples))

    return iwae


def create_label_table_fn(model, likelihood: str, num_samples: int, *, chunk: int = 10
                          ) -> Callable:
    """Jitted `table(variables, images f32[B, 784], key) -> f32[B, 10]`: the K-sample bound on
    log p(x | y) for every label y in one batched pass of 10 B rows (row b * 10 + y is image b
    with label y), the ten labels of an image sharing their draws. `chunk` samples at a time
    (each 10 B rows wide)."""
    padded, indices = _chunks(num_samples, chunk)
    labels_of = jnp.arange(NUM_CLASSES, dtype=jnp.int32)

    @jax.jit
    def table(variables, images, key):
        rows = images.shape[0]
        repeated = jnp.repeat(images, NUM_CLASSES, axis=0)
        labels = jnp.tile(labels_of, rows)
        weights_of = sampling_log_weights_fn(model, variables)
        shape = (rows, model.noise_dim)

        def body(chunk_indices):
            noise = jax.vmap(lambda index: sample_noise(key, index, shape))(chunk_indices)
            weights = weights_of(repeated, labels, jnp.repeat(noise, NUM_CLASSES, axis=1))
            return jnp.where((chunk_indices < num_samples)[:, None], weights, -jnp.inf)

        weights = jax.lax.map(body, indices).reshape(padded, -1)
        bounds = jax.nn.logsumexp(weights, axis=0) - jnp.log(float(num_samples))
        return bounds.reshape(rows, NUM_CLASSES)

    return table


def binarize_levels(key: jax.Array, images_u8) -> jax.Array:
    """uint8 pixels [B, 28, 28] or [B, 784] -> a binarised draw, float32[B, 784]
    (`cvae.model.binarization`)."""
    return binarize(key, to_unit(jnp.asarray(images_u8).reshape(len(images_u8), -1)))


def test_set_bounds(model, variables: dict, *, images_u8: np.ndarray, labels: np.ndarray,
                    key: jax.Array, num_samples: int, marginal_samples: int,
                    batch_size: int = 100, chunk: int = 100,
                    likelihood: str = "bernoulli") -> dict[str, np.ndarray]:
    """Per-example bounds on a binarised test set (batch i binarised with fold_in(key, i)).

    Returns {"log_px_given_y": [N] (K = num_samples, true label), "label_bounds": [N, 10]
    (`marginal_samples` for every label, common draws: Bayes' rule reads its argmax),
    "log_px_given_label": [N, 10] (the same with the true label's column the K-sample figure),
    "log_px": [N]} — or only the first when marginal_samples is 0.
    """
    cond_fn = create_iwae_fn(model, likelihood, num_samples, chunk=chunk)
    table_fn = (create_label_table_fn(model, likelihood, marginal_samples,
                                      chunk=max(1, chunk // NUM_CLASSES))
                if marginal_samples else None)
    binarize_key, sample_key = jax.random.split(key)
    n = len(images_u8)
    conditional, tables = [], []
    for i, start in enumerate(range(0, n, batch_size)):
        rows = slice(start, min(start + batch_size, n))
        pad = batch_size - (rows.stop - rows.start)
        x = binarize_levels(jax.random.fold_in(binarize_key, i),
                            np.pad(images_u8[rows].reshape(-1, IMAGE_PIXELS), ((0, pad), (0, 0))))
        y = jnp.asarray(np.pad(labels[rows], (0, pad)), jnp.int32)
        batch_key = jax.random.fold_in(sample_key, i)
        conditional.append(np.asarray(cond_fn(variables, x, y, batch_key))[:batch_size - pad])
        if table_fn is not None:
            tables.append(np.asarray(table_fn(variables, x, jax.random.fold_in(batch_key, 1)))
                          [:batch_size - pad])
    result = {"log_px_given_y": np.concatenate(conditional)}
    if tables:
        result["label_bounds"] = np.concatenate(tables)
        table = result["label_bounds"].copy()
        table[np.arange(n), np.asarray(labels)] = result["log_px_given_y"]
        result["log_px_given_label"] = table
        result["log_px"] = marginal_log_likelihood(table)
    return result


def bayes_rule_error(label_bounds: np.ndarray, labels: np.ndarray) -> dict:
    """Bayes' rule under a uniform p(y), argmax_y of the bounds, against the true labels."""
    predicted = np.argmax(label_bounds, axis=1)
    labels = np.asarray(labels)
    return {"error": float(np.mean(predicted != labels)),
            "error_per_digit": [float(np.mean(predicted[labels == d] != d))
                                if np.any(labels == d) else None for d in range(NUM_CLASSES)]}


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
    log_px_given_y, log_px_given_label, log_px = (np.asarray(a, np.float64) for a in (
        log_px_given_y, log_px_given_label, log_px))  # float32 rounds at thousands of nats
    upper_gap = float(np.max(-log_px - (-log_px_given_y + math.log(NUM_CLASSES))))
    lower_gap = float(np.max(-log_px_given_label.max(axis=1) - (-log_px)))
    return {"ok": bool(upper_gap <= tolerance and lower_gap <= tolerance),
            "max_upper_violation": upper_gap, "max_lower_violation": lower_gap}
