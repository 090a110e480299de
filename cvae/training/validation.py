"""The per-epoch validation: exact averages of the training objective and its terms on the
validation split, and the supervision's own figures (q(y|x)'s error with few labels).

`create_eval_step` + `evaluate` give exact averages of the training objective
(cvae/model/objectives.py, free bits included) and its terms over any set of images: the
loop calls them on the validation split every evaluated epoch (`create_validation`), and
`cvae eval` once on the test set (`cvae.evaluation.run`).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from cvae.config.sections import Config
from cvae.data.splits import TrainValidation
from cvae.model import objectives, registry
from cvae.model.binarization import maybe_binarize
from cvae.training.devices import replicate
from cvae.training.step import device_arrays, eval_key, to_batch

ACTIVE_UNIT_NATS = 0.01  # a latent dimension is active when its mean KL exceeds this


def create_eval_step(model, config: Config) -> Callable:
    """`eval_step(variables, images_u8, labels, mask, key) -> per-batch sums of each term`.

    Sums (not means) so batches of unequal size combine exactly; `mask` marks real rows of the
    padded last batch. Evaluation binarises like training and draws one z per example; the
    terms are the ELBO's under the prior training uses (cvae/model/objectives.py).
    """

    @jax.jit
    def eval_step(variables, images, labels, mask, key):
        binarize_key, z_key = jax.random.split(key)
        batch = to_batch(images, labels)
        x = maybe_binarize(binarize_key, batch["image"], config)
        noise = objectives.draw_noise(z_key, model, samples=1, batch=x.shape[0])
        terms = model.apply(variables, x, batch["label"], noise, method="terms")
        first = jax.tree.map(lambda a: a[0], terms)
        reconstruction, kl = objectives.first_draw_elbo(terms)
        return {
            "reconstruction": jnp.sum(reconstruction * mask),
            "kl": jnp.sum(kl * mask),
            "kl_per_dim": jnp.sum(first.kl_dims * mask[:, None], axis=0),
            "kl_rest": jnp.sum(first.kl_rest * mask),
            "count": jnp.sum(mask),
        }

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
    rest_dims = registry.noise_dim(config) - kl_per_dim.shape[-1]
    counted = objectives.counted_kl(result["kl"], kl_per_dim, float(totals["kl_rest"]) / count,
                                    rest_dims=rest_dims, free_bits=config.objective.free_bits)
    result["loss"] = float(result["reconstruction"] + config.objective.kl_weight * counted)
    result["neg_elbo"] = result["reconstruction"] + result["kl"]
    result["active_units"] = int(np.sum(kl_per_dim > ACTIVE_UNIT_NATS))
    return result


def create_validation(model, config: Config, *, split: TrainValidation, mesh,
                      supervision) -> Callable:
    """`validate(state, key) -> metrics` on the validation split: the training objective's
    terms, and the `supervision`'s figures (`cvae.training.supervision`)."""
    eval_step = create_eval_step(model, config)
    images, labels = replicate(device_arrays(split.validation_images, split.validation_labels),
                               mesh)
    figures = supervision.create_validation_figures(model)

    def validate(state, key) -> dict[str, float]:
        metrics = evaluate(eval_step, state.eval_variables(), images=images, labels=labels,
                           key=key, batch_size=config.run.eval_batch_size, config=config)
        return {**metrics, **figures(state.eval_variables(), images, labels)}

    return validate
