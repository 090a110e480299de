"""A run's config, nested by concern: one frozen dataclass per section, each stage reading its
own (the Flax examples' and big_vision's nested configs).

`model`, `prior` and `likelihood` each name a registered component (`cvae.config.components`)
and hold that component's own `Options`; the other sections are fixed. The config is stored as
JSON inside every checkpoint, so sampling, evaluation and the service rebuild the exact model
from the checkpoint directory alone; `from_dict` reads that nested form, and the flat form of
earlier versions through the one translation table of `cvae.config.flat`. Settings are named by
path ("model.options.latent_dim") or, where unambiguous, by their flat name ("latent_dim"):
`replace(latent_dim=8)`. The named configs (`--preset`) are in `cvae/config/presets.py`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from cvae.config import components, flat
from cvae.config.components import (Component, LikelihoodSection, ModelSection, PriorSection,
                                    read_component)
from cvae.config.settings import as_dict, check_ranges, coerce, hints, read, setting
from cvae.errors import ConfigError
from cvae.limits import MAX_SEED

# Settings a resumed run may change; every other one decides the parameter shapes, the
# optimizer state, the data order or the objective, so it must match the checkpoint.
# (`optimizer.schedule_epochs` is checked on its own: `cvae.training.start.keep_schedule_span`.)
RESUMABLE_CHANGES = ("run.epochs", "optimizer.schedule_epochs", "run.max_steps",
                     "run.steps_per_call", "run.eval_batch_size", "run.eval_every",
                     "run.early_stopping_patience", "run.early_stopping_min_delta",
                     "run.keep_checkpoints", "data.source", "drawing.truncation",
                     "drawing.pixel_sharpness")

ZERO_OR_MORE = {"low": 0}
ONE_OR_MORE = {"low": 1}


@dataclasses.dataclass(frozen=True)
class DataSection:
    """data: which images, read how, and how many held out for validation."""

    dataset: str = setting("mnist", "Which dataset to train on: mnist, fashion_mnist, or one "
                                    "prepared by `cvae data --from PATH --name NAME`.")
    source: Literal["idx", "torchvision"] = setting(
        "idx", "Read the IDX files directly, or through torchvision.datasets (the torch extra).")
    train_limit: int = setting(0, "Train on the first N training examples only (0 = all; for "
                                  "smoke runs).", **ZERO_OR_MORE)
    validation_size: int = setting(
        1000, "Examples of the training file held out for validation: MNIST's last N (10000 is "
              "the source's own validation set); other datasets draw them by --seed.",
        **ZERO_OR_MORE)


@dataclasses.dataclass(frozen=True)
class ObjectiveSection:
    """objective: the bound training maximises and the KL's weight."""

    bound: Literal["elbo", "iwae", "dreg"] = setting(
        "elbo", "Training bound: the ELBO, or the importance-weighted bound with its plain "
                "gradient (iwae) or the doubly reparameterised one (dreg, Tucker et al. 2019).")
    importance_samples: int = setting(
        1, "With --objective iwae or dreg: samples K per image.", low=1, high=256)
    kl_weight: float = setting(
        1.0, "Beta, the weight of the KL in the loss (1 = the ELBO); above 1 buys class-faithful "
             "samples from the standard prior at some nats (docs/training.md, 'Why beta 1 "
             "and a mixture prior').", **ZERO_OR_MORE)
    kl_schedule: Literal["constant", "linear"] = setting(
        "constant", "KL weight over training: constant, or rising linearly from 0 over "
                    "--kl-warmup-steps.")
    kl_warmup_steps: int = setting(0, "Steps of the linear KL warm-up.", **ZERO_OR_MORE)
    free_bits: float = setting(
        0.0, "Floor, in nats, on each latent dimension's batch-mean KL in the loss (0 = off).",
        **ZERO_OR_MORE)

    def check(self) -> None:
        if self.bound == "elbo" and self.importance_samples != 1:
            raise ConfigError(f"importance_samples={self.importance_samples}: only with "
                              f"--objective iwae or dreg (the ELBO draws one sample)")
        if self.bound != "elbo" and self.free_bits > 0:
            raise ConfigError(f"free_bits={self.free_bits}: only with --objective elbo (the "
                              f"importance-weighted bound has no KL term to floor)")


@dataclasses.dataclass(frozen=True)
class OptimizerSection:
    """optimizer: the Optax optimizer, its learning-rate schedule and what it updates."""

    name: Literal["adam", "adamw", "sgd", "rmsprop"] = setting("adam", "The Optax optimizer.")
    learning_rate: float = setting(1e-3, "Peak learning rate of the schedule.", low=0, high=10,
                                   open_low=True)
    end_learning_rate: float = setting(
        1e-5, "Learning rate at the end of a decaying schedule.", **ZERO_OR_MORE)
    lr_schedule: Literal["constant", "linear", "cosine", "warmup_cosine", "warmup_linear"] = (
        setting("warmup_cosine", "Learning rate over the optimizer updates of all epochs."))
    warmup_steps: int = setting(
        500, "Updates of linear warm-up from 0 for the warmup_* schedules.", **ZERO_OR_MORE)
    schedule_epochs: int = setting(
        0, "Epochs the learning-rate schedule spans (0 = --epochs); a run extended with a "
           "larger --epochs keeps its span and trains on at the schedule's final rate.",
        **ZERO_OR_MORE)
    weight_decay: float = setting(
        0.0, "Weight decay: decoupled for adamw, added to the gradient for the others.",
        **ZERO_OR_MORE)
    momentum: float = setting(0.9, "Momentum of sgd and rmsprop.", low=0, high=1,
                              open_high=True)
    grad_clip_norm: float = setting(0.0, "Clip gradients to this global norm (0 = no "
                                         "clipping).", **ZERO_OR_MORE)
    accumulation_steps: int = setting(
        1, "Micro-batches per optimizer update (optax.MultiSteps); the effective batch is "
           "this times --batch-size.", **ONE_OR_MORE)
    ema_decay: float = setting(
        0.0, "Decay of an exponential moving average of the parameters, used for evaluation "
             "and sampling (0 = none).", low=0, high=1, open_high=True)
    freeze: Literal["none", "encoder", "decoder"] = setting(
        "none", "Keep the encoder or the decoder fixed (e.g. with --init-from).")

    def check(self) -> None:
        if self.end_learning_rate > self.learning_rate:
            raise ConfigError(f"end_learning_rate={self.end_learning_rate}: "
                              f"must be in [0, learning_rate={self.learning_rate}]")


@dataclasses.dataclass(frozen=True)
class RunSection:
    """run: the seed, the batches, how long, and when to evaluate and keep checkpoints."""

    seed: int = setting(0, f"Seed of everything random in the run, 0..{MAX_SEED}.", low=0,
                        high=MAX_SEED)
    batch_size: int = setting(128, "Examples per training step (a multiple of the device "
                                   "count).", **ONE_OR_MORE)
    epochs: int = setting(140, "Passes over the training set; the schedules span all of them.",
                          **ONE_OR_MORE)
    max_steps: int = setting(0, "Stop after this many (micro-batch) steps (0 = no limit); the "
                                "schedules still span --epochs.", **ZERO_OR_MORE)
    steps_per_call: int = setting(50, "Train steps fused into one device call (lax.scan).",
                                  **ONE_OR_MORE)
    eval_every: int = setting(10, "Epochs between evaluations, checkpoints and sample grids "
                                  "(and after the last epoch).", **ONE_OR_MORE)
    eval_batch_size: int = setting(1000, "Examples per evaluation batch (memory only, not the "
                                         "result).", **ONE_OR_MORE)
    early_stopping_patience: int = setting(
        0, "Stop after this many evaluations without a --early-stopping-min-delta improvement "
           "of the validation loss (0 = off).", **ZERO_OR_MORE)
    early_stopping_min_delta: float = setting(
        0.0, "The smallest fall of the validation loss that counts as an improvement.",
        **ZERO_OR_MORE)
    keep_checkpoints: int = setting(3, "Latest checkpoints kept (the best one is kept as "
                                       "well).", **ONE_OR_MORE)


@dataclasses.dataclass(frozen=True)
class LabelsSection:
    """labels: how many training labels are used; with few, the M2 classifier's terms (Kingma
    et al. 2014; docs/semi-supervised.md)."""

    count: str = setting(
        "all", "Training labels used: all (a conditional VAE), or N, a multiple of the class "
               "count: N class-balanced images keep their labels, the rest train without "
               "them, and a classifier q(y|x) is learnt beside the encoder "
               "(docs/semi-supervised.md).")
    classifier_weight: float = setting(
        0.1, "Weight of the labelled images' mean cross-entropy of q(y|x) against the loss per "
             "training image: the paper's alpha = 0.1 * N on its objective summed over the N "
             "training images.", **ZERO_OR_MORE)
    labelled_per_batch: int = setting(
        16, "With --labels N: labelled images in each batch (the rest unlabelled), cycled "
            "through the N within an epoch.")
    classifier_shift: int = setting(
        0, "With --labels N: q(y|x) reads each training image moved by up to this many pixels "
           "each way, a fresh random shift every step (0 = as it is).", low=0, high=8)
    consistency_weight: float = setting(
        0.0, "With --labels N and --classifier-shift: weight of the squared difference between "
             "q(y|x)'s readings of two shifts of each unlabelled image (0 = off).",
        **ZERO_OR_MORE)
    entropy_weight: float = setting(0.0, "With --labels N: weight of the unlabelled images' "
                                         "mean entropy of q(y|x), minimised (0 = off).",
                                    **ZERO_OR_MORE)
    vat_weight: float = setting(
        0.0, "With --labels N: weight of virtual adversarial training's term (Miyato et al. "
             "2018): q(y|x)'s divergence at the nearby image that changes it most (0 = off).",
        **ZERO_OR_MORE)
    vat_epsilon: float = setting(
        0.3, "With --vat-weight: the L2 length of that nearby image's offset, pixels in [0, 1] "
             "(0.3: the paper's for MNIST with 100 labels).", low=0, open_low=True)

    @property
    def labelled_count(self) -> int | None:
        """How many training images keep their labels; None = all of them."""
        return None if self.count == "all" else int(self.count)

    def check(self) -> None:
        if self.count != "all" and not (self.count.isdigit() and int(self.count) > 0):
            raise ConfigError(f"labels={self.count!r}: must be all, or a positive multiple of "
                              f"the class count (the same number of each class)")


@dataclasses.dataclass(frozen=True)
class DrawingSection:
    """drawing: how samples are drawn and rendered; never the weights, training or the
    bounds."""

    truncation: float = setting(
        0.75, "Quantile of N(0, I)'s radius beyond which a sample's noise is pulled in onto it "
              "(1 = off): fewer draws from the prior's tails, where most misread samples are. "
              "Sampling only: training and the bounds never see it.", low=0, high=1,
        open_low=True)
    pixel_sharpness: float = setting(
        1.3, "The decoder rendered at temperature 1/s (1 = its means): a Bernoulli's images are "
             "sigmoid(s * pixel logits); a logistic mixture weighs each pixel's components by "
             "their weights to the power s, so a large s draws a pixel from its likeliest "
             "component instead of blending its modes into grey. Rendering only: training and "
             "the bounds never see it.", low=0,
        high=10, open_low=True)


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything that defines a run, by concern; each stage reads its own section."""

    data: DataSection = DataSection()
    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    prior: PriorSection = dataclasses.field(default_factory=PriorSection)
    likelihood: LikelihoodSection = dataclasses.field(default_factory=LikelihoodSection)
    objective: ObjectiveSection = ObjectiveSection()
    optimizer: OptimizerSection = OptimizerSection()
    run: RunSection = RunSection()
    labels: LabelsSection = LabelsSection()
    drawing: DrawingSection = DrawingSection()

    def validate(self) -> Config:
        """Raise ConfigError naming the first bad setting; return self so calls chain."""
        for section in dataclasses.fields(self):
            values = getattr(self, section.name)
            if isinstance(values, Component):
                check_ranges(values.options, f"{section.name}.options")
                getattr(values.options, "check", lambda: None)()
            else:
                check_ranges(values, section.name)
                getattr(values, "check", lambda: None)()
        if self.labels.count != "all" and not (
                1 <= self.labels.labelled_per_batch < self.run.batch_size):
            raise ConfigError(f"labelled_per_batch={self.labels.labelled_per_batch}: must be "
                              f"in [1, batch_size - 1 = {self.run.batch_size - 1}]")
        return self

    def replace(self, **changes: Any) -> Config:
        """This config with settings changed, each named by its flat name (`latent_dim`,
        `prior`) or its path with `__` for dots (`model__options__latent_dim`)."""
        return self.updated({flat.path_of(name.replace("__", "."), type(self)): value
                             for name, value in changes.items()})

    def updated(self, changes: dict[str, Any]) -> Config:
        """This config with the settings at these paths changed; a component's name first, so
        its options are the new component's."""
        config = self
        for path in sorted(changes, key=lambda p: not p.endswith(".name")):
            config = _set(config, path.split("."), changes[path])
        return config

    def drawn_at(self, truncation: float | None) -> Config:
        """This config, its samples truncated at `truncation` (None: at its own): what the
        `--truncation` of `cvae sample`, `cvae serve`, `cvae export` and `cvae eval` loads.
        Sampling only, so the weights serve unchanged."""
        if truncation is None:
            return self
        return dataclasses.replace(self, drawing=dataclasses.replace(self.drawing,
                                                                     truncation=truncation))

    def drawing_dict(self) -> dict[str, float]:
        """How this config draws and renders its samples: what two sets of sample figures of
        the same weights must share to be the same figures."""
        return as_dict(self.drawing)

    def to_dict(self) -> dict[str, Any]:
        """The nested form: each section a table, a component's as its name and options."""
        out = {}
        for section in dataclasses.fields(self):
            values = getattr(self, section.name)
            out[section.name] = ({"name": values.name, "options": as_dict(values.options)}
                                 if isinstance(values, Component) else as_dict(values))
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Config:
        """The nested form, or the flat form of earlier checkpoints and files (keys an old
        one lacks mean what that version did: `cvae.config.flat.LEGACY_ABSENT`)."""
        if not flat.is_nested(values):
            defaults = {kind: getattr(cls(), kind).name for kind in components.KINDS}
            return cls().updated(flat.translate(values, defaults)).validate()
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(f"{unknown[0]}: unknown config section (known: "
                              f"{', '.join(f.name for f in dataclasses.fields(cls))})")
        sections = {}
        for section in dataclasses.fields(cls):
            given = values.get(section.name, {})
            default = getattr(cls(), section.name)
            if not isinstance(given, dict):
                raise ConfigError(f"{section.name}: must be a table of settings")
            if isinstance(default, Component):
                sections[section.name] = read_component(type(default), given, section.name)
            else:
                sections[section.name] = read(type(default), given, section.name)
        return cls(**sections).validate()

    @classmethod
    def from_json(cls, text: str) -> Config:
        return cls.from_dict(json.loads(text))

    def leaves(self) -> dict[str, Any]:
        """Every setting by its path: "run.epochs" -> 140."""
        return flat.leaves(self.to_dict())

    def diff(self, other: Config, paths: tuple[str, ...] | None = None) -> dict[str, tuple]:
        """Settings (optionally only those at `paths`) whose values differ: path -> (self's,
        other's). A component's options differ wherever its name does."""
        mine, theirs = self.leaves(), other.leaves()
        names = paths or tuple(dict.fromkeys([*mine, *theirs]))
        return {p: (mine.get(p), theirs.get(p)) for p in names if mine.get(p) != theirs.get(p)}


def _set(node: Any, parts: list[str], value: Any) -> Any:
    """`node` with the setting at `parts` set to `value` (the value typed as its field)."""
    head, rest = parts[0], parts[1:]
    if isinstance(node, Component) and head == "name" and not rest:
        return node.switched_to(str(value))
    if isinstance(node, Component) and head == "options" and rest:
        node.check_option(rest[0])
    if head not in hints(type(node)):
        raise ConfigError(f"{'.'.join(parts)}: unknown setting of {type(node).__name__}")
    if rest:
        return dataclasses.replace(node, **{head: _set(getattr(node, head), rest, value)})
    return dataclasses.replace(node, **{head: coerce(hints(type(node))[head], value, head)})


def as_flags(changes: dict[str, Any]) -> list[str]:
    """`cvae train` flags that set the settings at these paths to these values (a component's
    name first, so its options' flags are its own)."""
    flags = []
    for path in sorted(changes, key=lambda p: not p.endswith(".name")):
        value, flag = changes[path], "--" + flat.flat_name(path, Config).replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, ",".join(map(str, value)) if isinstance(value, (tuple, list))
                      else str(value)]
    return flags
