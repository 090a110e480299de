"""Every training objective, written on the model interface's `Terms` alone (in nats).

For an image x, its label y and K reparameterised draws z_k ~ q(z | x, y), a family gives the
per-draw terms log p(x | z_k, y), log p(z_k | y) and log q(z_k | x, y) (cvae/model/interface.py).
From them:

- ELBO: reconstruction + beta * KL, one draw; the KL in closed form where the family has it,
  and each dimension's batch-mean KL floored at `free_bits` nats (so no dimension is pushed to
  carry nothing);
- IWAE (Burda et al. 2016): logsumexp_k log w_k - log K, log w_k = log p(x | z_k, y) +
  beta * (log p(z_k | y) - log q(z_k | x, y)); K = 1 is the single-draw ELBO;
- DReG (Tucker et al. 2019): the same bound, with the doubly reparameterised gradient. Its
  plain gradient starves the encoder as K grows (signal-to-noise like 1/sqrt(K), Rainforth
  et al. 2018); with w~ = softmax_k(log w) held constant, the encoder gets sum_k w~_k^2
  d log w_k / d z_k d z_k / d phi and the model sum_k w~_k d log w_k / d theta (z_k fixed).
  `dreg_surrogate` weighs two evaluations of log w so that one `jax.grad` gives each parameter
  its part; a parameter in both roles (a VampPrior's encoder, a ladder's top-down networks)
  gets the sum, the chain rule over its two uses;
- M2's labelled and unlabelled terms (cvae/training/few_labels.py) weigh these per-row bounds.

`row_terms` computes any of them per row, `batch_loss` combines rows into the loss. Bayes' rule
(`per_label_bounds`, `bayes_classify`) reads a class from the same log weights.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from cvae.model.interface import Terms


class RowTerms(NamedTuple):
    """One batch's per-row figures, f32[B] unless said otherwise."""

    neg_bound: jax.Array  # the per-row objective the gradient is taken of
    reconstruction: jax.Array  # -log p(x | z, y) of the first draw
    kl: jax.Array  # the first draw's KL (closed form where it exists), unweighted
    kl_dims: jax.Array  # f32[B, Da]: the closed-form part of it, per dimension
    kl_rest: jax.Array  # the sampled part of it
    bound: jax.Array  # the bound's value per row (the ELBO, or IWAE_K)
    rest_dims: int  # how many latent dimensions kl_rest covers (static)


def log_weights(terms: Terms, kl_weight=1.0) -> jax.Array:
    """log w = log p(x|z,y) + beta * (log p(z|y) - log q(z|x,y)): f32[K, B]."""
    return terms.log_px + kl_weight * (terms.log_pz - terms.log_qz)


def iwae_bound(log_w: jax.Array, *, samples: int | None = None) -> jax.Array:
    """logsumexp_k log w_k - log K: f32[K', B] -> f32[B]. `samples`: K where the K' rows hold
    K draws and padding at -inf (evaluation's chunks); default K = K'."""
    return jax.nn.logsumexp(log_w, axis=0) - jnp.log(float(samples or log_w.shape[0]))


def elbo_terms(log_px: jax.Array, kl_dims: jax.Array,
               kl_rest: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The ELBO's two terms, f32[...] each: (-log p(x|z,y), the KL), the KL the closed-form
    dimensions' `kl_dims` f32[..., Da] summed plus the rest's estimate `kl_rest` (`Terms`'
    fields). The one place the ELBO is written: training, validation and `cvae eval` read it
    through `first_draw_elbo`, each family's `reconstruct` through `negative_elbo`."""
    return -log_px, kl_dims.sum(axis=-1) + kl_rest


def first_draw_elbo(terms: Terms) -> tuple[jax.Array, jax.Array]:
    """(-log p(x|z,y), the KL) of the first draw, f32[B] each: `elbo_terms` of `terms[0]`."""
    first = jax.tree.map(lambda a: a[0], terms)
    return elbo_terms(first.log_px, first.kl_dims, first.kl_rest)


def negative_elbo(log_px: jax.Array, kl_dims: jax.Array, kl_rest: jax.Array) -> jax.Array:
    """-ELBO = reconstruction + KL, f32[...], of `elbo_terms`' two terms (what a family's
    `reconstruct` gives at the posterior mean)."""
    reconstruction, kl = elbo_terms(log_px, kl_dims, kl_rest)
    return reconstruction + kl


def normalized_weights(log_w: jax.Array) -> jax.Array:
    """w~ = softmax over the K draws, held constant: f32[K, B] -> f32[K, B]."""
    return jax.lax.stop_gradient(jax.nn.softmax(log_w, axis=0))


def dreg_surrogate(encoder_path: jax.Array, model_path: jax.Array) -> jax.Array:
    """f32[B] whose value is IWAE_K and whose gradient is DReG's (module docstring).

    encoder_path: log w f32[K, B] whose only way to the parameters is through the draws;
    model_path: log w with the draws fixed and q's density frozen. The surrogate
    sum_k sg(w~_k^2) log w_k (encoder path) + sum_k sg(w~_k) log w_k (model path) is added
    as (surrogate - sg(surrogate)), zero, to the bound's value.
    """
    weights = normalized_weights(model_path)
    surrogate = (jnp.sum(jnp.square(weights) * encoder_path, axis=0)
                 + jnp.sum(weights * model_path, axis=0))
    bound = iwae_bound(jax.lax.stop_gradient(model_path))
    return bound + surrogate - jax.lax.stop_gradient(surrogate)


def row_terms(model, variables: dict, *, images, labels, noise, objective: str, kl_weight,
              train: bool = False, rngs: dict | None = None, mutable=(),
              also: Callable | None = None) -> tuple[RowTerms, Any, Any]:
    """One batch's `RowTerms` under `objective` ("elbo", "iwae", "dreg"), from unit-normal
    noise f32[K, B, noise_dim] (K = 1 for the ELBO).

    `also(module)` runs inside the same apply (M2's q(y|x) reading the batch), so a BatchNorm
    sees every part once. -> (rows, also's result, updated mutable collections).
    """
    rngs = rngs or {}

    def forward(module):
        terms = module.terms(images, labels, noise, train=train)
        return terms, (also(module) if also else None)

    (terms, extra), updates = model.apply(variables, method=forward, rngs=rngs, mutable=mutable)
    first = jax.tree.map(lambda a: a[0], terms)
    rec, kl = first_draw_elbo(terms)
    rest = model.noise_dim - first.kl_dims.shape[-1]
    if objective == "elbo":
        rows = RowTerms(rec + kl_weight * kl, rec, kl, first.kl_dims, first.kl_rest, -(rec + kl),
                        rest)
    elif objective == "iwae":
        bound = iwae_bound(log_weights(terms, kl_weight))
        rows = RowTerms(-bound, rec, kl, first.kl_dims, first.kl_rest, bound, rest)
    elif objective == "dreg":
        bound = _dreg_bound(model, variables, images=images, labels=labels, noise=noise,
                            kl_weight=kl_weight, train=train, rngs=rngs)
        rows = RowTerms(-bound, rec, kl, first.kl_dims, first.kl_rest, bound, rest)
    else:
        raise ValueError(f"objective={objective!r}: allowed elbo, iwae, dreg")
    return rows, extra, updates


def _dreg_bound(model, variables, *, images, labels, noise, kl_weight, train, rngs):
    """DReG's surrogate f32[B]: the draws with live parameters, scored with frozen ones
    (encoder path); the draws fixed, scored with live ones, q's density frozen (model path)."""
    params = variables["params"]

    def with_params(p):
        return {**variables, "params": p}

    def apply(p, method, *args):
        return model.apply(with_params(p), images, labels, *args, method=method, train=train,
                           rngs=rngs)

    frozen = jax.lax.stop_gradient(params)
    z = apply(params, "draws", noise)
    encoder_path = log_weights(apply(frozen, "score", z), kl_weight)
    fixed = jax.lax.stop_gradient(z)
    live, still = apply(params, "score", fixed), apply(frozen, "score", fixed)
    model_path = live.log_px + kl_weight * (live.log_pz - still.log_qz)
    return dreg_surrogate(encoder_path, model_path)


def counted_kl(kl, kl_dims_mean, kl_rest_mean, *, rest_dims: int, free_bits: float):
    """The KL as the ELBO's loss counts it: the mean KL itself, or with free bits each
    closed-form dimension's mean floored at `free_bits` and the sampled part's mean at
    `free_bits` a dimension it covers (`rest_dims`)."""
    if free_bits <= 0:
        return kl
    counted = jnp.maximum(kl_dims_mean, free_bits).sum()
    if rest_dims:
        counted = counted + jnp.maximum(kl_rest_mean, free_bits * rest_dims)
    return counted


def batch_loss(rows: RowTerms, *, objective: str, kl_weight, free_bits: float,
               weights: jax.Array | None = None) -> tuple[jax.Array, dict]:
    """The batch's loss and its terms from its rows: their mean, or their sum under `weights`
    f32[B] (M2's). With free bits (the ELBO's), each closed-form dimension's (weighted) mean KL
    is floored at `free_bits`, and the sampled KL's mean at `free_bits` a dimension it covers.
    -> (loss, {"reconstruction", "kl", "loss", and "bound" for IWAE and DReG})."""

    def mean(values):
        if weights is None:
            return values.mean(axis=0)
        return jnp.einsum("b,b...->...", weights, values)

    rec, kl = mean(rows.reconstruction), mean(rows.kl)
    counted = kl
    if objective == "elbo":
        counted = counted_kl(kl, mean(rows.kl_dims), mean(rows.kl_rest),
                             rest_dims=rows.rest_dims, free_bits=free_bits)
    if objective == "elbo" and weights is None:
        loss = rec + kl_weight * counted  # the sum of the means, as the ELBO is written
    else:
        loss = mean(rows.neg_bound) + kl_weight * (counted - kl)
    terms = {"reconstruction": rec, "kl": kl, "loss": loss}
    if objective != "elbo":
        terms["bound"] = mean(rows.bound)
    return loss, terms


BATCHED_LABEL_ROWS = 256  # images x labels read as one batch by `per_label_bounds`


def per_label_bounds(log_weights_fn: Callable, images: jax.Array, noise: jax.Array, *,
                     num_classes: int) -> jax.Array:
    """IWAE_K bound on log p(x | y) for every label y: f32[B, classes], in one call.

    log_weights_fn(images f32[R, P], labels i32[R], noise f32[K, R, D]) -> f32[K, R]; noise
    f32[K, B, D] is shared by an image's labels (common random numbers: the labels' bounds
    differ by the model, not by the draws). Up to `BATCHED_LABEL_ROWS` rows (B x classes) go
    through the model as one batch (a picture the service reads: every label at once);
    above it the labels take their turn in a compiled loop (`lax.map`), so the memory is one
    label's K x B decoder rows: all ten at once, a convolutional decoder's maps for a block of
    1,024 digits took about 6 GB of scratch (tests/test_convolution.py).
    """
    b = images.shape[0]
    if b * num_classes <= BATCHED_LABEL_ROWS:
        labels = jnp.repeat(jnp.arange(num_classes, dtype=jnp.int32), b)
        log_w = log_weights_fn(jnp.tile(images, (num_classes, 1)), labels,
                               jnp.tile(noise, (1, num_classes, 1)))
        return iwae_bound(log_w).reshape(num_classes, b).T

    def one_label(label):
        return iwae_bound(log_weights_fn(images, jnp.full((b,), label, jnp.int32), noise))

    return jax.lax.map(one_label, jnp.arange(num_classes, dtype=jnp.int32)).T


def bayes_classify(label_bounds: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Bayes' rule under a uniform p(y): bounds f32[B, C] -> (argmax_y i32[B], p(y | x)
    f32[B, C], the bounds normalised over the labels)."""
    return (jnp.argmax(label_bounds, axis=-1).astype(jnp.int32),
            jax.nn.softmax(label_bounds, axis=-1))


def sampling_log_weights_fn(model, variables: dict) -> Callable:
    """`fn(images f32[R, P], labels i32[R], noise f32[K, R, D]) -> log w f32[K, R]`: the model's
    log weights under the prior its samples come from (what `cvae eval`'s bounds and Bayes'
    rule score), for given unit-normal noise."""

    def fn(images, labels, noise):
        terms = model.apply(variables, images, labels, noise, method="terms",
                            sampling_prior=True)
        return log_weights(terms)

    return fn


BAYES_SAMPLES = 16  # importance draws per label of a Bayes-rule reading
_BAYES_SEED = 0  # its draws are fixed: a picture's reading depends on the picture alone


def create_bayes_classify_fn(model, num_samples: int = BAYES_SAMPLES) -> Callable:
    """Jitted `classify(variables, images f32[B, P] in [0, 1]) -> p(y | x) f32[B, classes]`:
    every label's IWAE bound on log p(x | y) in one call (a label at a time), normalised under
    a uniform p(y). The draws are fixed (seed 0, one noise vector per draw, the same for every
    row), so a row's reading does not depend on its neighbours."""

    @jax.jit
    def classify(variables, images):
        noise = jax.random.normal(jax.random.key(_BAYES_SEED), (num_samples, 1, model.noise_dim))
        noise = jnp.broadcast_to(noise, (num_samples, images.shape[0], model.noise_dim))
        bounds = per_label_bounds(sampling_log_weights_fn(model, variables), images, noise,
                                  num_classes=model.num_classes)
        return bayes_classify(bounds)[1]

    return classify


def draw_noise(key: jax.Array, model, *, samples: int, batch: int) -> jax.Array:
    """A step's unit-normal noise, f32[K, B, noise_dim]: the first draw is the one an
    [B, noise_dim] draw from the same key gives (threefry counts over the flat shape)."""
    return jax.random.normal(key, (samples, batch, model.noise_dim))
