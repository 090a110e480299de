"""Each model's own importance log weights, for `cvae eval`'s bounds and Bayes-rule reading.

For an image x, a label y and a unit-normal noise vector per draw, log w = log p(x | z, y) +
log p(z | y) - log q(z | x, y), z the reparameterised draw: the one-latent CVAE's (encoder once,
decoder on every draw), or the ladder VAE's over all its layers (cvae/model/hierarchical.py).
p(z | y) at the top is N(0, I), or the mixture in the variable collection "prior" where the
model has one: the ex-post fitted mixture, or a learned prior written there by
`lever_losses.learned_prior_collection`; so the bound is that of the prior the samples come
from. `create_bayes_classify_fn` reads a digit by Bayes' rule with these weights: what
`/classify` answers for a model trained with every label.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from cvae.model import hierarchical
from cvae.model import objectives as obj
from cvae.model import prior as prior_lib
from cvae.model.losses import reconstruction

BAYES_SAMPLES = 16  # importance samples per label of a Bayes-rule reading
_BAYES_SEED = 0  # its draws are fixed: a picture's reading depends on the picture alone


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
        return obj.gaussian_log_density(z, 0.0, jnp.zeros_like(z))

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
        return log_px + log_pz_fn(z, labels) - obj.gaussian_log_density(z, mean, logvar)

    return one_latent


def create_bayes_classify_fn(model, likelihood: str = "bernoulli",
                             num_samples: int = BAYES_SAMPLES) -> Callable:
    """Jitted `classify(variables, images f32[B, 784] in [0, 1]) -> p(y | x) f32[B, 10]`: the
    ten labels' IWAE bounds on log p(x | y) in one call, a label at a time
    (`objectives.per_label_bounds`, common draws), normalised under a uniform p(y). The draws
    are fixed (seed 0, one noise vector per sample and row), so a row's reading does not
    depend on its neighbours."""

    @jax.jit
    def classify(variables, images):
        weights_of = log_weights_fn(model, variables, likelihood)
        noise = jax.random.normal(jax.random.key(_BAYES_SEED),
                                  (num_samples, 1, noise_width(model)))
        noise = jnp.broadcast_to(noise, (num_samples, images.shape[0], noise.shape[-1]))
        return obj.bayes_classify(obj.per_label_bounds(weights_of, images, noise))[1]

    return classify
