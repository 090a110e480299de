"""Settings by flat name: the flags (`--latent-dim`), `replace(latent_dim=8)`, and the flat
configs of earlier versions (checkpoints and TOML files written before the config was nested).

`LEGACY` is the one translation table: each flat name of the last flat version -> its path
now. A flat name is also how a flag names its setting: a path that `LEGACY` names keeps its old
name, and a new one is named by its last part where no other setting shares it (else by its
path, dots as underscores). Standard library and the config package only.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, NamedTuple

from cvae.config import components
from cvae.errors import ConfigError

# The flat config's 59 fields (the last flat version, 2026-11-29) -> the nested path.
LEGACY: dict[str, str] = {
    "dataset": "data.dataset", "data_source": "data.source", "train_limit": "data.train_limit",
    "validation_size": "data.validation_size",
    "model": "model.name", "architecture": "model.options.architecture",
    "hidden_sizes": "model.options.hidden_sizes", "latent_dim": "model.options.latent_dim",
    "activation": "model.options.activation",
    "label_conditioning": "model.options.label_conditioning",
    "logvar_bound": "model.options.logvar_bound", "dropout_rate": "model.options.dropout_rate",
    "batch_norm": "model.options.batch_norm",
    "stochastic_layers": "model.options.stochastic_layers",
    "upper_latent_dim": "model.options.upper_latent_dim",
    "prior": "prior.name", "prior_components": "prior.options.components",
    "pseudo_inputs": "prior.options.pseudo_inputs", "prior_codes": "prior.options.codes",
    "likelihood": "likelihood.name", "binarization": "likelihood.options.binarization",
    "pixel_sharpness": "drawing.pixel_sharpness", "truncation": "drawing.truncation",
    "kl_weight": "objective.kl_weight", "kl_schedule": "objective.kl_schedule",
    "kl_warmup_steps": "objective.kl_warmup_steps", "free_bits": "objective.free_bits",
    "objective": "objective.bound", "importance_samples": "objective.importance_samples",
    "optimizer": "optimizer.name", "learning_rate": "optimizer.learning_rate",
    "end_learning_rate": "optimizer.end_learning_rate",
    "lr_schedule": "optimizer.lr_schedule", "warmup_steps": "optimizer.warmup_steps",
    "weight_decay": "optimizer.weight_decay", "momentum": "optimizer.momentum",
    "grad_clip_norm": "optimizer.grad_clip_norm",
    "accumulation_steps": "optimizer.accumulation_steps", "ema_decay": "optimizer.ema_decay",
    "freeze": "optimizer.freeze", "schedule_epochs": "optimizer.schedule_epochs",
    "batch_size": "run.batch_size", "epochs": "run.epochs", "max_steps": "run.max_steps",
    "seed": "run.seed", "steps_per_call": "run.steps_per_call",
    "eval_batch_size": "run.eval_batch_size", "eval_every": "run.eval_every",
    "early_stopping_patience": "run.early_stopping_patience",
    "early_stopping_min_delta": "run.early_stopping_min_delta",
    "keep_checkpoints": "run.keep_checkpoints",
    "labels": "labels.count", "classifier_weight": "labels.classifier_weight",
    "labelled_per_batch": "labels.labelled_per_batch",
    "classifier_shift": "labels.classifier_shift",
    "consistency_weight": "labels.consistency_weight",
    "entropy_weight": "labels.entropy_weight", "vat_weight": "labels.vat_weight",
    "vat_epsilon": "labels.vat_epsilon",
}

# What a key missing from a flat checkpoint means, where the code that wrote it differs from
# the default: no validation split (they trained on the whole training file; resuming them
# needs --fresh), N(0, I), which every checkpoint before the mixture prior sampled, the
# decoder's plain means, which every checkpoint before the sharpness rendered, and no
# truncation, which none before it had.
LEGACY_ABSENT: dict[str, Any] = {"validation_size": 0, "prior": "standard",
                                 "pixel_sharpness": 1.0, "truncation": 1.0}


class Leaf(NamedTuple):
    """One setting: its path, the dataclass and field that declare it, and for a component's
    option the components that have it."""

    path: str
    owner: type
    field: str
    components: tuple[str, ...] = ()

    @property
    def hint(self) -> Any:
        return typing.get_type_hints(self.owner)[self.field]

    @property
    def doc(self) -> str:
        return next(f.metadata.get("doc", "") for f in dataclasses.fields(self.owner)
                    if f.name == self.field)


def all_leaves(config_class: type) -> dict[str, Leaf]:
    """Every setting a config of `config_class` can hold (each registered component's options
    included), by path, in the sections' order; a component's name is described by its
    section."""
    found: dict[str, Leaf] = {}
    for section in dataclasses.fields(config_class):
        default = getattr(config_class(), section.name)
        if not hasattr(default, "KIND"):
            for field in dataclasses.fields(default):
                found[f"{section.name}.{field.name}"] = Leaf(
                    f"{section.name}.{field.name}", type(default), field.name)
            continue
        found[f"{section.name}.name"] = Leaf(f"{section.name}.name", type(default), "name")
        for name in components.names(default.KIND):
            options = components.options_class(default.KIND, name)
            for field in dataclasses.fields(options):
                path = f"{section.name}.options.{field.name}"
                earlier = found.get(path)
                found[path] = Leaf(path, earlier.owner if earlier else options, field.name,
                                   (*(earlier.components if earlier else ()), name))
    return found


def flat_names(config_class: type) -> dict[str, str]:
    """Flat name -> path for every setting (`LEGACY`'s names where it has them)."""
    leaves = all_leaves(config_class)
    legacy = {path: name for name, path in LEGACY.items()}
    counts: dict[str, int] = {}
    for path in leaves:
        counts[path.rsplit(".", 1)[1]] = counts.get(path.rsplit(".", 1)[1], 0) + 1
    names = {}
    for path in leaves:
        last = path.rsplit(".", 1)[1]
        name = legacy.get(path) or (last if counts[last] == 1 and last not in LEGACY
                                    else path.replace(".options.", "_").replace(".", "_"))
        names[name] = path
    return names


def path_of(name: str, config_class: type) -> str:
    """The path a flat name or a path names; ConfigError for an unknown one."""
    if "." in name:
        return name
    path = LEGACY.get(name) or flat_names(config_class).get(name)
    if path is None:
        raise ConfigError(f"unknown setting {name!r}")
    return path


def flat_name(path: str, config_class: type) -> str:
    """The flat name (and so the flag, dashed) of the setting at `path`."""
    return next(name for name, where in flat_names(config_class).items() if where == path)


def is_nested(values: dict[str, Any]) -> bool:
    """Whether a stored config is the nested form (a table per section) or a flat one."""
    return any(isinstance(value, dict) for value in values.values())


def leaves(nested: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict's leaves by dotted path."""
    out = {}
    for key, value in nested.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
    return out


def translate(values: dict[str, Any], defaults: dict[str, str], *,
              stored: bool = True) -> dict[str, Any]:
    """A flat config of an earlier version -> its settings by path. In a `stored` config (a
    checkpoint's) a missing key means what it meant then (`LEGACY_ABSENT`); in a file, the
    preset's value. An option of a component the config does not name had no effect then, and
    is dropped. `defaults`: each component kind's name where the config names none."""
    unknown = sorted(set(values) - set(LEGACY))
    if unknown:
        raise ConfigError(f"unknown config field(s): {', '.join(unknown)}")
    if stored:
        values = {**{k: v for k, v in LEGACY_ABSENT.items() if k not in values}, **values}
    if stored and "model" not in values:  # stored before families had names: depth told
        values["model"] = "ladder" if int(values.get("stochastic_layers", 1)) > 1 else "cvae"
    chosen = {kind: str(values.get(kind, defaults[kind])) for kind in components.KINDS}
    paths = {}
    for name, value in values.items():
        path = LEGACY[name]
        section, _, rest = path.partition(".")
        if rest.startswith("options.") and not _has_option(section, chosen[section],
                                                           rest.split(".")[1]):
            continue
        paths[path] = value
    return paths


def _has_option(kind: str, name: str, option: str) -> bool:
    try:
        options = components.options_class(kind, name)
    except ValueError:
        raise ConfigError(f"{kind}={name!r}: allowed {', '.join(components.names(kind))}")
    return option in {f.name for f in dataclasses.fields(options)}
