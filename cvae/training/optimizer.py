"""Optax pieces composed from the config: schedules, the optimizer chain, the KL weight.

Each factory returns a pure function or an `optax.GradientTransformation`, so the train step
stays one jitted closure and nothing here holds state of its own.
"""

from __future__ import annotations

import re

import flax
import jax.numpy as jnp
import optax

from cvae.config.sections import Config
from cvae.errors import ConfigError
from cvae.model import registry


def create_learning_rate_schedule(config: Config, total_steps: int) -> optax.Schedule:
    """Learning rate as a function of the optimizer update count.

    `total_steps` counts optimizer updates (micro-batch steps / accumulation_steps).
    """
    peak, end = config.optimizer.learning_rate, config.optimizer.end_learning_rate
    total = max(int(total_steps), 1)
    warmup = min(config.optimizer.warmup_steps, total - 1)
    name = config.optimizer.lr_schedule
    if name == "constant":
        return optax.constant_schedule(peak)
    if name == "linear":
        return optax.linear_schedule(peak, end, transition_steps=total)
    if name == "cosine":
        return optax.cosine_decay_schedule(peak, decay_steps=total, alpha=end / peak)
    if name == "warmup_cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=peak, warmup_steps=warmup, decay_steps=total, end_value=end)
    if name == "warmup_linear":
        return optax.join_schedules(
            [optax.linear_schedule(0.0, peak, max(warmup, 1)),
             optax.linear_schedule(peak, end, max(total - warmup, 1))],
            boundaries=[max(warmup, 1)])
    raise ConfigError(f"lr_schedule={name!r}: unknown")


def _base_optimizer(config: Config, schedule: optax.Schedule) -> optax.GradientTransformation:
    name = config.optimizer.name
    if name == "adam":
        return optax.adam(schedule)
    if name == "adamw":
        return optax.adamw(schedule, weight_decay=config.optimizer.weight_decay)
    if name == "sgd":
        return optax.sgd(schedule, momentum=config.optimizer.momentum or None, nesterov=False)
    if name == "rmsprop":
        return optax.rmsprop(schedule, momentum=config.optimizer.momentum or None)
    raise ConfigError(f"optimizer={name!r}: unknown")


def freeze_labels(params, frozen_modules: tuple[str, ...]):
    """'frozen' for every leaf under a top-level module in `frozen_modules` (a family's
    `PARAM_GROUPS` entry, cvae/model/registry.py; list modules such as a ladder's `upper_0`
    count by their name less the index), else 'trainable'."""
    def label(path, _):
        return "frozen" if re.sub(r"_\d+$", "", path[0]) in frozen_modules else "trainable"

    return flax.traverse_util.path_aware_map(label, params)


def create_optimizer(config: Config, total_steps: int) -> tuple[optax.GradientTransformation,
                                                                  optax.Schedule]:
    """The full chain from the config, and its learning-rate schedule (for logging).

    clip -> (added weight decay for sgd/rmsprop) -> base optimizer, wrapped in multi_transform
    when part of the model is frozen and in MultiSteps when gradients accumulate.
    """
    updates_total = max(total_steps // config.optimizer.accumulation_steps, 1)
    schedule = create_learning_rate_schedule(config, updates_total)
    parts = []
    if config.optimizer.grad_clip_norm > 0:
        parts.append(optax.clip_by_global_norm(config.optimizer.grad_clip_norm))
    if config.optimizer.weight_decay > 0 and config.optimizer.name in ("sgd", "rmsprop", "adam"):
        parts.append(optax.add_decayed_weights(config.optimizer.weight_decay))
    parts.append(_base_optimizer(config, schedule))
    tx = optax.chain(*parts) if len(parts) > 1 else parts[0]
    if config.optimizer.freeze != "none":
        tx = optax.multi_transform(
            {"trainable": tx, "frozen": optax.set_to_zero()},
            lambda params: freeze_labels(params,
                                         registry.param_groups(config)[config.optimizer.freeze]))
    if config.optimizer.accumulation_steps > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=config.optimizer.accumulation_steps)
    return tx, schedule


def create_kl_weight_schedule(config: Config) -> optax.Schedule:
    """KL weight per micro-batch step: constant, or linear warm-up from 0 ("KL annealing")."""
    if config.objective.kl_schedule == "linear" and config.objective.kl_warmup_steps > 0:
        return optax.linear_schedule(0.0, config.objective.kl_weight,
                                     config.objective.kl_warmup_steps)
    return lambda step: jnp.asarray(config.objective.kl_weight, jnp.float32)
