"""The per-epoch validation: exact averages of the training objective and its terms on the
validation split, and the supervision's own figures (q(y|x)'s error with few labels).

`create_eval_step` + `evaluate` give exact averages of the training objective
(`cvae.model.losses.objective`, free bits included) and its terms over any set of images: the
loop calls them on the validation split every evaluated epoch (`create_validation`), and
`cvae eval` once on the test set (`cvae.evaluation.run`).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from cvae.config import Config
from cvae.data.splits import TrainValidation
from cvae.model import lever_losses
from cvae.model.binarization import maybe_binarize
from cvae.model.losses import kl_divergence, kl_per_dimension, objective, reconstruction
from cvae.model.networks import CVAE
from cvae.training.devices import replicate
from cvae.training.step import device_arrays, eval_key, to_batch

ACTIVE_UNIT_NATS = 0.01  # a latent dimension is active when its mean KL exceeds this


def create_eval_step(model: CVAE, config: Config) -> Callable:
    """`eval_step(variables, images_u8, labels, mask, key) -> per-batch sums of each term`.

    Sums (not means) so batches of unequal size combine exactly; `mask` marks real rows of the
    padded last batch. Evaluation binarises like training and draws one z per example.
    """

    if lever_losses.uses_levers(config):
        return _create_lever_eval_step(model, config)

    @jax.jit
    def eval_step(variables, images, labels, mask, key):
        binarize_key, z_key = jax.random.split(key)
        batch = to_batch(images, labels)
        x = maybe_binarize(binarize_key, batch["image"], config)
        logits, mean, logvar = model.apply(variables, x, batch["label"], z_key, train=False)
        return {
            "reconstruction": jnp.sum(reconstruction(logits, x, config.likelihood) * mask),
            "kl": jnp.sum(kl_divergence(mean, logvar) * mask),
            "kl_per_dim": jnp.sum(kl_per_dimension(mean, logvar) * mask[:, None], axis=0),
            "count": jnp.sum(mask),
        }

    return eval_step


def _create_lever_eval_step(model, config: Config) -> Callable:
    """`create_eval_step`'s for a model with levers: one draw's ELBO terms through
    `lever_losses.elbo_per_example` (every ladder layer, a learned prior's KL)."""

    @jax.jit
    def eval_step(variables, images, labels, mask, key):
        binarize_key, z_key = jax.random.split(key)
        batch = to_batch(images, labels)
        x = maybe_binarize(binarize_key, batch["image"], config)
        noise = lever_losses.draw_noise(z_key, model,
                                        config=config.replace(importance_samples=1),
                                        batch=x.shape[0])
        terms = lever_losses.elbo_per_example(model, variables, images=x, labels=batch["label"],
                                              noise=noise, likelihood=config.likelihood)
        return {"reconstruction": jnp.sum(terms["reconstruction"] * mask),
                "kl": jnp.sum(terms["kl"] * mask),
                "kl_per_dim": jnp.sum(terms["kl_per_dim"] * mask[:, None], axis=0),
                "count": jnp.sum(mask)}

    return eval_step


def evaluate(eval_step: Callable, variables: dict, *, images: jax.Array, labels: jax.Array,
             key: jax.Array, batch_size: int, config: Config) -> dict[str, float]:
    """Exact averages over `images`: {reconstruction, kl, loss, neg_elbo, active_units}.

    "loss" is the training objective with the final KL weight; with free bits, the floor applies
    to each dimension's mean KL over the whole set, so the figure does not depend on
    `batch_size`. "kl" is unweighted and "neg_elbo" = reconstruction + kl.
    """
    n = images.shape[0]
    base_key = eval_key(key)
    totals = None
    for i, start in enumerate(range(0, n, batch_size)):
        stop = min(start + batch_size, n)
        pad = batch_size - (stop - start)
        rows = jnp.pad(images[start:stop], ((0, pad), (0, 0)))
        row_labels = jnp.pad(labels[start:stop], (0, pad))
        mask = (jnp.arange(batch_size) < stop - start).astype(jnp.float32)
        sums = eval_step(variables, rows, row_labels, mask, jax.random.fold_in(base_key, i))
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    totals = jax.device_get(totals)
    count = float(totals["count"])
    result = {name: float(totals[name]) / count for name in ("reconstruction", "kl")}
    kl_per_dim = totals["kl_per_dim"] / count
    result["loss"] = float(objective(result["reconstruction"], result["kl"], kl_per_dim,
                                     kl_weight=config.kl_weight, free_bits=config.free_bits))
    result["neg_elbo"] = result["reconstruction"] + result["kl"]
    result["active_units"] = int(np.sum(kl_per_dim > ACTIVE_UNIT_NATS))
    return result


def create_validation(model: CVAE, config: Config, *, split: TrainValidation, mesh,
                      supervision) -> Callable:
    """`validate(state, key) -> metrics` on the validation split: the training objective's
    terms, and the `supervision`'s figures (`cvae.training.supervision`)."""
    eval_step = create_eval_step(model, config)
    images, labels = replicate(device_arrays(split.validation_images, split.validation_labels),
                               mesh)
    figures = supervision.create_validation_figures(model)

    def validate(state, key) -> dict[str, float]:
        metrics = evaluate(eval_step, state.eval_variables(), images=images, labels=labels,
                           key=key, batch_size=config.eval_batch_size, config=config)
        return {**metrics, **figures(state.eval_variables(), images, labels)}

    return validate
