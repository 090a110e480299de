"""Importance-weighted bounds (Burda et al. 2015) on log p(x | y) and log p(x), in nats, through
each model's own log weights.

For one binarised image x and label y, with q = q(z | x, y) and K samples z_k ~ q:

    log p(x | y) >= log (1/K) sum_k p(x | z_k, y) p(z_k | y) / q(z_k | x, y)

K = 1 is the single-sample ELBO; the bound tightens in expectation as K grows. `log_weights_fn`
gives each model's log w: the one-latent CVAE's (encoder once, decoder on every draw), and the
ladder VAE's over all its layers (cvae/model/hierarchical.py: log p(x | z, y) + log p(z | y) -
log q(z | x, y), every layer's prior and posterior). p(z | y) at the top is N(0, I), or the
mixture in the variable collection "prior" where the model has one: the ex-post fitted mixture,
or a learned prior written there by `learned_prior.as_mixture`; so the bound is that of the
prior the samples are drawn from.

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
from cvae.model import hierarchical
from cvae.model import prior as prior_lib
from cvae.model.losses import reconstruction
from cvae.model.objectives import gaussian_log_density


def sample_noise(key: jax.Array, index: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """The standard-normal noise of importance sample `index`: depends on (key, index) only."""
    return jax.random.normal(jax.random.fold_in(key, index), shape, jnp.float32)


def noise_width(model) -> int:
    """D of the noise one importance sample needs: every ladder layer, or the CVAE's latent."""
    if isinstance(model, hierarchical.LadderCVAE):
        return model.total_dim
    return model.config.latent_dim


def top_log_prior(variables: dict) -> Callable | None:
    """log p(z_top | y) from the "prior" collection (z f32[..., B, L], labels i32[B] ->
    f32[..., B]), or None for N(0, I)."""
    mixture = variables.get(prior_lib.COLLECTION, {}).get(prior_lib.VARIABLE)
    if mixture is None:
        return None

    def log_prior(z, labels):
        flat = z.reshape(-1, *z.shape[-2:])
        return jax.vmap(lambda one: prior_lib.log_density(mixture, one, labels))(flat).reshape(
            z.shape[:-1])

    return log_prior


def log_weights_fn(model, variables: dict, likelihood: str) -> Callable:
    """`fn(images f32[R, 784], labels i32[R], noise f32[K, R, D]) -> log w f32[K, R]`, the
    model's own log weights (module docstring) for the given unit-normal noise."""
    log_prior = top_log_prior(variables)

    def standard(z, labels):
        del labels
        return gaussian_log_density(z, 0.0, jnp.zeros_like(z))

    if isinstance(model, hierarchical.LadderCVAE):
        def ladder(images, labels, noise):
            outputs = model.apply(variables, images, labels, noise)
            log_px = -reconstruction(outputs.logits, jnp.broadcast_to(
                images, outputs.logits.shape), likelihood)
            return (log_px + hierarchical.log_p(outputs, labels, log_prior)
                    - hierarchical.log_q(outputs))
        return ladder

    log_pz_fn = log_prior or standard

    def one_latent(images, labels, noise):
        mean, logvar = model.apply(variables, images, labels, method="encode")
        z = mean + jnp.exp(0.5 * logvar) * noise
        k, rows = noise.shape[:2]
        flat_labels = jnp.tile(labels, k)
        logits = model.apply(variables, z.reshape(k * rows, -1), flat_labels, method="decode")
        log_px = -reconstruction(logits, jnp.tile(images, (k, 1)), likelihood).reshape(k, rows)
        return log_px + log_pz_fn(z, labels) - gaussian_log_density(z, mean, logvar)

    return one_latent


def log_weights(model, variables: dict, images: jax.Array, labels: jax.Array, key: jax.Array,
                indices: jax.Array, likelihood: str) -> jax.Array:
    """log w_k for the samples `indices`: float32[len(indices), B].

    images: float32[B, 784] (binarised for the Bernoulli likelihood); labels: int32[B].
    """
    shape = (images.shape[0], noise_width(model))
    noise = jax.vmap(lambda index: sample_noise(key, index, shape))(indices)
    return log_weights_fn(model, variables, likelihood)(images, labels, noise)


def _chunks(num_samples: int, chunk: int) -> tuple[int, jax.Array]:
    if num_samples < 1 or chunk < 1:
        raise ValueError(f"num_samples={num_samples}, chunk={chunk}: both must be >= 1")
    chunk = min(chunk, num_samples)
    num_chunks = -(-num_samples // chunk)
    return num_chunks * chunk, jnp.arange(num_chunks * chunk).reshape(num_chunks, chunk)


def create_iwae_fn(model, likelihood: str, num_samples: int, chunk: int = 100) -> Callable:
    """Jitted `iwae(variables, images f32[B, 784], labels i32[B], key) -> log p(x|y) bound [B]`.

    The K = num_samples samples are evaluated `chunk` at a time (K is padded up to a multiple of
    the chunk; padded samples get weight zero), so peak memory is set by `chunk`, not K.
    """
    padded, indices = _chunks(num_samples, chunk)

    @jax.jit
    def iwae(variables, images, labels, key):
        def body(chunk_indices):
            weights = log_weights(model, variables, images, labels, key, chunk_indices,
                                  likelihood)
            return jnp.where((chunk_indices < num_samples)[:, None], weights, -jnp.inf)

        weights = jax.lax.map(body, indices).reshape(padded, -1)
        return jax.nn.logsumexp(weights, axis=0) - jnp.log(float(num_samples))

    return iwae


def create_label_table_fn(model, likelihood: str, num_samples: int, chunk: int = 10
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
        weights_of = log_weights_fn(model, variables, likelihood)
        shape = (rows, noise_width(model))

        def body(chunk_indices):
            noise = jax.vmap(lambda index: sample_noise(key, index, shape))(chunk_indices)
            weights = weights_of(repeated, labels, jnp.repeat(noise, NUM_CLASSES, axis=1))
            return jnp.where((chunk_indices < num_samples)[:, None], weights, -jnp.inf)

        weights = jax.lax.map(body, indices).reshape(padded, -1)
        bounds = jax.nn.logsumexp(weights, axis=0) - jnp.log(float(num_samples))
        return bounds.reshape(rows, NUM_CLASSES)

    return table


@jax.jit
def binarize(key: jax.Array, images_u8: jax.Array) -> jax.Array:
    """Dynamic binarisation of uint8 pixels: x ~ Bernoulli(pixel / 255), float32[B, 784]."""
    probs = images_u8.reshape(images_u8.shape[0], -1).astype(jnp.float32) / 255.0
    return jax.random.bernoulli(key, probs).astype(jnp.float32)


def test_set_bounds(model, variables: dict, images_u8: np.ndarray, labels: np.ndarray,
                    key: jax.Array, num_samples: int, marginal_samples: int,
                    batch_size: int = 100, chunk: int = 100,
                    likelihood: str = "bernoulli") -> dict[str, np.ndarray]:
    """Per-example bounds on a binarised test set (batch i binarised with fold_in(key, i)).

    Returns {"log_px_given_y": [N] (K = num_samples, true label), "label_bounds": [N, 10]
    (`marginal_samples` for every label, common draws: Bayes' rule reads its argmax),
    "log_px_given_label": [N, 10] (the same with the true label's column the K-sample figure),
    "log_px": [N]} — or only the first when marginal_samples is 0.
    """
    cond_fn = create_iwae_fn(model, likelihood, num_samples, chunk)
    table_fn = (create_label_table_fn(model, likelihood, marginal_samples,
                                      max(1, chunk // NUM_CLASSES))
                if marginal_samples else None)
    binarize_key, sample_key = jax.random.split(key)
    n = len(images_u8)
    conditional, tables = [], []
    for i, start in enumerate(range(0, n, batch_size)):
        rows = slice(start, min(start + batch_size, n))
        pad = batch_size - (rows.stop - rows.start)
        x = binarize(jax.random.fold_in(binarize_key, i),
                     jnp.asarray(np.pad(images_u8[rows].reshape(-1, 784), ((0, pad), (0, 0)))))
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
                   log_px: np.ndarray, tolerance: float = 1e-3) -> dict[str, float | bool]:
    """The two inequalities that hold for every example, given the same per-label estimates:

    -log p(x) <= -log p(x|y) + log 10   (the true label's own share of the sum), and
    -log p(x) >= min_y' -log p(x|y')    (a mean of ten terms is at most their largest).
    """
    upper_gap = float(np.max(-log_px - (-log_px_given_y + math.log(NUM_CLASSES))))
    lower_gap = float(np.max(-log_px_given_label.max(axis=1) - (-log_px)))
    return {"ok": bool(upper_gap <= tolerance and lower_gap <= tolerance),
            "max_upper_violation": upper_gap, "max_lower_violation": lower_gap}
