"""One frozen dataclass holds every knob of a run.

The config is stored as JSON inside every checkpoint, so sampling, evaluation and the service
rebuild the exact model from the checkpoint directory alone. `from_json` tolerates keys that an
older checkpoint lacks (they take today's defaults) and rejects keys it does not know, so a typo
never passes silently. Presets are plain functions whose docstring gives the command and what to
expect from it.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

ACTIVATIONS = ("relu", "gelu", "silu", "elu", "tanh", "leaky_relu")
LIKELIHOODS = ("bernoulli", "gaussian")
BINARIZATIONS = ("none", "dynamic")
ARCHITECTURES = ("mlp", "conv")
LABEL_CONDITIONINGS = ("first", "every")
OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop")
LR_SCHEDULES = ("constant", "linear", "cosine", "warmup_cosine", "warmup_linear")
KL_SCHEDULES = ("constant", "linear")
FREEZE_OPTIONS = ("none", "encoder", "decoder")
DATASETS = ("mnist", "fashion_mnist", "kmnist")
DATA_SOURCES = ("idx", "torchvision")
# Seeds are 32-bit: without jax_enable_x64 a key keeps only 32 bits of its seed, so larger
# values would silently collide with smaller ones. Training, sampling and the service share it.
MAX_SEED = 2**32 - 1


class ConfigError(ValueError):
    """A config value is out of range; the message names the field and what is allowed."""


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything that defines a run. Field names are the `cvae train` flags (with dashes)."""

    # Data.
    dataset: str = "mnist"
    data_source: str = "idx"
    train_limit: int = 0  # 0 = all training examples; N = the first N (smoke runs)
    binarization: str = "dynamic"  # bernoulli only: resample pixels ~ Bernoulli(intensity) each step

    # Model.
    architecture: str = "mlp"
    hidden_sizes: tuple[int, ...] = (512, 256)
    latent_dim: int = 16
    activation: str = "gelu"
    label_conditioning: str = "first"  # decoder: label added at the first layer, or at every one
    likelihood: str = "bernoulli"
    logvar_bound: float = 8.0  # soft clamp of log-variance to (-bound, bound): KL cannot overflow
    dropout_rate: float = 0.0
    batch_norm: bool = False

    # Objective.
    kl_weight: float = 4.0  # beta > 1 buys class-faithful, sharp samples at some nats (README)
    kl_schedule: str = "constant"
    kl_warmup_steps: int = 0
    free_bits: float = 0.0  # floor on the KL of each latent dimension, nats (batch-averaged)

    # Optimisation.
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    end_learning_rate: float = 1e-5  # for decaying schedules
    lr_schedule: str = "warmup_cosine"
    warmup_steps: int = 500
    weight_decay: float = 0.0  # decoupled for adamw; added to the gradient for the others
    momentum: float = 0.9  # sgd and rmsprop
    grad_clip_norm: float = 0.0  # 0 = no clipping
    accumulation_steps: int = 1  # optax.MultiSteps over k micro-batches
    ema_decay: float = 0.0  # 0 = no EMA of parameters
    freeze: str = "none"  # train only part of the model (e.g. after --init-from)

    # Loop.
    batch_size: int = 128
    epochs: int = 40
    max_steps: int = 0  # 0 = no limit; counts micro-batch steps
    seed: int = 0
    steps_per_call: int = 50  # train steps fused into one device call (lax.scan)
    eval_batch_size: int = 1000
    early_stopping_patience: int = 0  # 0 = off; epochs without min_delta improvement of test loss
    early_stopping_min_delta: float = 0.0
    keep_checkpoints: int = 3

    def validate(self) -> Config:
        """Raise ConfigError naming the first bad field; return self so calls chain."""
        choices = {
            "dataset": DATASETS,
            "data_source": DATA_SOURCES,
            "binarization": BINARIZATIONS,
            "architecture": ARCHITECTURES,
            "label_conditioning": LABEL_CONDITIONINGS,
            "activation": ACTIVATIONS,
            "likelihood": LIKELIHOODS,
            "kl_schedule": KL_SCHEDULES,
            "optimizer": OPTIMIZERS,
            "lr_schedule": LR_SCHEDULES,
            "freeze": FREEZE_OPTIONS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name}={getattr(self, name)!r}: allowed {', '.join(allowed)}")
        positive_ints = ("latent_dim", "batch_size", "steps_per_call", "eval_batch_size",
                         "accumulation_steps", "keep_checkpoints", "epochs")
        for name in positive_ints:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be >= 1")
        non_negative = ("train_limit", "max_steps", "kl_warmup_steps", "warmup_steps",
                        "early_stopping_patience", "kl_weight", "free_bits", "weight_decay",
                        "grad_clip_norm", "early_stopping_min_delta", "seed")
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)}: must be >= 0")
        if not self.hidden_sizes or min(self.hidden_sizes) < 1:
            raise ConfigError(f"hidden_sizes={self.hidden_sizes}: need one or more sizes >= 1")
        if self.seed > MAX_SEED:
            raise ConfigError(f"seed={self.seed}: must be in [0, {MAX_SEED}]")
        if not 0 < self.learning_rate <= 10:
            raise ConfigError(f"learning_rate={self.learning_rate}: must be in (0, 10]")
        if not 0 <= self.end_learning_rate <= self.learning_rate:
            raise ConfigError(f"end_learning_rate={self.end_learning_rate}: "
                              f"must be in [0, learning_rate={self.learning_rate}]")
        if not 0 <= self.ema_decay < 1:
            raise ConfigError(f"ema_decay={self.ema_decay}: must be in [0, 1)")
        if not 0 <= self.dropout_rate < 1:
            raise ConfigError(f"dropout_rate={self.dropout_rate}: must be in [0, 1)")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"momentum={self.momentum}: must be in [0, 1)")
        if not 0 < self.logvar_bound <= 30:
            raise ConfigError(f"logvar_bound={self.logvar_bound}: must be in (0, 30]")
        return self

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Config:
        """Keys missing from `values` (older checkpoints) take the defaults; unknown keys fail."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(f"unknown config field(s): {', '.join(unknown)}")
        hints = typing.get_type_hints(cls)
        kwargs = {name: coerce(hints[name], value, name) for name, value in values.items()}
        return cls(**kwargs).validate()

    @classmethod
    def from_json(cls, text: str) -> Config:
        return cls.from_dict(json.loads(text))

    def diff(self, other: Config, fields: tuple[str, ...] | None = None) -> dict[str, tuple]:
        """Fields (optionally restricted to `fields`) whose values differ: name -> (self, other)."""
        names = fields or tuple(f.name for f in dataclasses.fields(self))
        return {n: (getattr(self, n), getattr(other, n)) for n in names
                if getattr(self, n) != getattr(other, n)}


# Fields a resumed run may change; every other field must match the checkpoint, because it
# decides the parameter shapes, the optimizer state, the data order or the objective.
RESUMABLE_CHANGES = ("epochs", "max_steps", "steps_per_call", "eval_batch_size",
                     "early_stopping_patience", "early_stopping_min_delta", "keep_checkpoints",
                     "data_source")


def coerce(hint: Any, value: Any, name: str) -> Any:
    """Convert a JSON or command-line value to the field's declared type."""
    try:
        if hint in ("tuple[int, ...]",) or typing.get_origin(hint) is tuple:
            if isinstance(value, str):
                value = [v for v in value.replace(",", " ").split() if v]
            return tuple(int(v) for v in value)
        if hint is bool or hint == "bool":
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if hint is int or hint == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if hint is float or hint == "float":
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r}: not a valid {getattr(hint, '__name__', hint)}")


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


# ---- Presets -------------------------------------------------------------------------------


def default() -> Config:
    """`make train` (= `cvae train`): MLP 784-512-256 -> 16 latent, Bernoulli likelihood.

    Expected on 2 CPU cores: about 5 minutes for 40 epochs; test negative ELBO about 101 nats;
    samples sharp and class-faithful (see README "Why Bernoulli").
    """
    return Config()


def seed() -> Config:
    """`cvae train --preset seed`: the seed document's setup, kept for comparison.

    MLP 784-256-128-64, latent 32, summed MSE (`optax.l2_loss`) Gaussian likelihood,
    kl_weight 0.5, adamw lr 1e-4 (constant), batch 16, ReLU. Samples are recognisable but blurry.
    """
    return Config(
        hidden_sizes=(256, 128, 64), latent_dim=32, activation="relu", likelihood="gaussian",
        binarization="none", kl_weight=0.5, optimizer="adamw", learning_rate=1e-4,
        end_learning_rate=1e-4, lr_schedule="constant", warmup_steps=0, weight_decay=1e-4,
        batch_size=16, epochs=10,
    )


def test() -> Config:
    """A CPU-seconds config for tests: tiny MLP, few steps."""
    return Config(hidden_sizes=(32,), latent_dim=4, batch_size=16, epochs=1, warmup_steps=0,
                  lr_schedule="constant", steps_per_call=4, eval_batch_size=64)


test.__test__ = False  # a preset, not a pytest test, wherever it is imported

PRESETS = {"default": default, "seed": seed, "test": test}


def get_preset(name: str) -> Config:
    if name not in PRESETS:
        raise ConfigError(f"preset={name!r}: allowed {', '.join(PRESETS)}")
    return PRESETS[name]()
