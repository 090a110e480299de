"""Importance-weighted bounds (Burda et al. 2015) on log p(x | y) and log p(x), in nats, through
each model's own log weights.

For one image x (binarised for the Bernoulli, its 8-bit levels for the discretised logistic) and
label y, with q = q(z | x, y) and K samples z_k ~ q:

    log p(x | y) >= log (1/K) sum_k p(x | z_k, y) p(z_k | y) / q(z_k | x, y)

K = 1 is the single-sample ELBO; the bound tightens in expectation as K grows. The log weights
are each model's own (`cvae.model.objectives.sampling_log_weights_fn`: the family's terms over
all its latent layers, with the prior its samples are drawn from, so the likelihood reported is
that of the model that draws the samples). The likelihood is the model's config's; nothing here
chooses it. Only a likelihood that is a density of the data has a bound (its class's `bounded`: the
Bernoulli and the logistic); the Gaussian's summed squared error is not one.

Sample k's noise is `normal(fold_in(key, k), [B, D])` (D the model's noise width: the latent, or
every ladder layer), a function of k alone, so a run cut into chunks of K sees exactly the
samples of an unchunked run. Chunks run under `lax.map`, so memory holds one chunk of
activations whatever K is. The marginal uses a uniform label prior over the C classes of the
model's dataset (`model.num_classes`): log p(x) = logsumexp_y' [log p(x | y') - log C].
`create_label_table_fn` scores every label in one batched pass with common draws (the labels'
bounds differ by the model, not by the noise): the table for the marginal and for Bayes' rule,
argmax_y log p(x | y). Images are flattened to the spec's `pixels` values a row (`model.data`,
a `cvae.data.specs.DatasetSpec`).
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from cvae.data.pixels import to_unit
from cvae.model.binarization import binarize, scores_levels
from cvae.model.objectives import iwae_bound, sampling_log_weights_fn

def sample_noise(key: jax.Array, index: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """The standard-normal noise of importance sample `index`: depends on (key, index) only."""
    return jax.random.normal(jax.random.fold_in(key, index), shape, jnp.float32)


def log_weights(model, variables: dict, *, images: jax.Array, labels: jax.Array,
                key: jax.Array, indices: jax.Array) -> jax.Array:
    """log w_k for the samples `indices`: float32[len(indices), B].

    images: float32[B, pixels] (binarised for the Bernoulli likelihood); labels: int32[B].
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


def create_iwae_fn(model, num_samples: int, *, chunk: int = 100) -> Callable:
    """Jitted `iwae(variables, images f32[B, pixels], labels i32[B], key) -> log p(x|y) bound
    [B]`.

    The K = num_samples samples are evaluated `chunk` at a time (K is padded up to a multiple of
    the chunk; padded samples get weight zero), so peak memory is set by `chunk`, not K.
    """
    padded, indices = _chunks(num_samples, chunk)

    @jax.jit
    def iwae(variables, images, labels, key):
        def body(chunk_indices):
            weights = log_weights(model, variables, images=images, labels=labels, key=key,
                                  indices=chunk_indices)
            return jnp.where((chunk_indices < num_samples)[:, None], weights, -jnp.inf)

        weights = jax.lax.map(body, indices).reshape(padded, -1)
        return iwae_bound(weights, samples=num_samples)

    return iwae


def create_label_table_fn(model, num_samples: int, *, chunk: int = 10) -> Callable:
    """Jitted `table(variables, images f32[B, pixels], key) -> f32[B, C]` (C the model's
    classes): the K-sample bound on log p(x | y) for every label y in one batched pass of C B
    rows (row b * C + y is image b with label y), the labels of an image sharing their draws.
    `chunk` samples at a time (each C B rows wide)."""
    padded, indices = _chunks(num_samples, chunk)
    classes = model.num_classes
    labels_of = jnp.arange(classes, dtype=jnp.int32)

    @jax.jit
    def table(variables, images, key):
        rows = images.shape[0]
        repeated = jnp.repeat(images, classes, axis=0)
        labels = jnp.tile(labels_of, rows)
        weights_of = sampling_log_weights_fn(model, variables)
        shape = (rows, model.noise_dim)

        def body(chunk_indices):
            noise = jax.vmap(lambda index: sample_noise(key, index, shape))(chunk_indices)
            weights = weights_of(repeated, labels, jnp.repeat(noise, classes, axis=1))
            return jnp.where((chunk_indices < num_samples)[:, None], weights, -jnp.inf)

        weights = jax.lax.map(body, indices).reshape(padded, -1)
        bounds = iwae_bound(weights, samples=num_samples)
        return bounds.reshape(rows, classes)

    return table


def binarize_levels(key: jax.Array, images_u8) -> jax.Array:
    """uint8 pixels [B, *image shape] or [B, pixels] -> a binarised draw, float32[B, pixels]
    (`cvae.model.binarization`)."""
    return binarize(key, to_unit(jnp.asarray(images_u8).reshape(len(images_u8), -1)))


def scored_inputs(key: jax.Array, images_u8, likelihood: str) -> jax.Array:
    """uint8 pixels [B, ...] -> float32[B, pixels] as the bounds read them: the levels'
    intensities for the discretised logistic (so its nats are those of the 8-bit data), a
    binarised draw otherwise."""
    if scores_levels(likelihood):
        return to_unit(jnp.asarray(images_u8).reshape(len(images_u8), -1))
    return binarize_levels(key, images_u8)


def test_set_bounds(model, variables: dict, *, images_u8: np.ndarray, labels: np.ndarray,
                    key: jax.Array, num_samples: int, marginal_samples: int,
                    batch_size: int = 100, chunk: int = 100) -> dict[str, np.ndarray]:
    """Per-example bounds on a binarised test set (batch i binarised with fold_in(key, i)).
    images_u8: uint8[N, *image shape] or [N, pixels] of the model's dataset (`model.data`).

    Returns {"log_px_given_y": [N] (K = num_samples, true label), "label_bounds": [N, C]
    (`marginal_samples` for every label, common draws: Bayes' rule reads its argmax),
    "log_px_given_label": [N, C] (the same with the true label's column the K-sample figure),
    "log_px": [N]} — or only the first when marginal_samples is 0. C: `model.num_classes`.
    """
    cond_fn = create_iwae_fn(model, num_samples, chunk=chunk)
    table_fn = (create_label_table_fn(model, marginal_samples,
                                      chunk=max(1, chunk // model.num_classes))
                if marginal_samples else None)
    binarize_key, sample_key = jax.random.split(key)
    n = len(images_u8)
    conditional, tables = [], []
    for i, start in enumerate(range(0, n, batch_size)):
        rows = slice(start, min(start + batch_size, n))
        pad = batch_size - (rows.stop - rows.start)
        rows_u8 = images_u8[rows].reshape(-1, model.data.pixels)
        x = scored_inputs(jax.random.fold_in(binarize_key, i),
                          np.pad(rows_u8, ((0, pad), (0, 0))), model.likelihood.name)
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
    """Bayes' rule under a uniform p(y), argmax_y of the bounds f[N, C], against the true
    labels; "error_per_digit" has one entry a class (None where the labels hold none)."""
    predicted = np.argmax(label_bounds, axis=1)
    labels = np.asarray(labels)
    return {"error": float(np.mean(predicted != labels)),
            "error_per_digit": [float(np.mean(predicted[labels == d] != d))
                                if np.any(labels == d) else None
                                for d in range(np.shape(label_bounds)[1])]}


def marginal_log_likelihood(log_px_given_label: np.ndarray) -> np.ndarray:
    """log p(x) = logsumexp_y [log p(x|y) + log p(y)] with p(y) = 1/C, C the table's columns
    (the classes): f[N, C] -> float64[N]."""
    table = np.asarray(log_px_given_label, np.float64)
    top = table.max(axis=1, keepdims=True)
    return (top[:, 0] + np.log(np.exp(table - top).sum(axis=1))) - math.log(table.shape[1])


def _half_ulp(values) -> np.ndarray:
    """Half a unit in the last place of each value in its own floating dtype, as float64: how
    far a bound stored in that dtype may sit from the one computed."""
    values = np.asarray(values)
    dtype = values.dtype if np.issubdtype(values.dtype, np.floating) else np.float64
    return 0.5 * np.spacing(np.abs(values).astype(dtype)).astype(np.float64)


def check_marginal(log_px_given_y: np.ndarray, log_px_given_label: np.ndarray,
                   log_px: np.ndarray, *, tolerance: float = 1e-3) -> dict[str, float | bool]:
    """The two inequalities that hold for every example, given the same per-label estimates
    (log_px_given_label f[N, C], C the classes):

    -log p(x) <= -log p(x|y) + log C    (the true label's own share of the sum), and
    -log p(x) >= min_y' -log p(x|y')    (a mean of C terms is at most their largest).

    Checked in float64 whatever the inputs' dtype: in float32, adding log C to a bound of
    tens of thousands of nats rounds by more than the tolerance. Each example may miss by
    `tolerance` plus the rounding its inputs were stored with (half a unit in the last place of
    each of the two values compared, in the dtype it came in: 0.002 nats for a float32 near
    33,000 nats, nothing to speak of for float64). The violations reported are the plain gaps.
    """
    raw = (log_px_given_y, log_px_given_label, log_px)
    log_px_given_y, log_px_given_label, log_px = (np.asarray(a, np.float64) for a in raw)
    classes = log_px_given_label.shape[1]
    best = np.asarray(raw[1]).max(axis=1)
    upper = -log_px - (-log_px_given_y + math.log(classes))
    lower = -log_px_given_label.max(axis=1) - (-log_px)
    upper_slack = tolerance + _half_ulp(raw[2]) + _half_ulp(raw[0])
    lower_slack = tolerance + _half_ulp(raw[2]) + _half_ulp(best)
    return {"ok": bool(np.all(upper <= upper_slack) and np.all(lower <= lower_slack)),
            "max_upper_violation": float(np.max(upper)),
            "max_lower_violation": float(np.max(lower))}
