"""One frozen dataclass holds every setting of a run.

The config is stored as JSON inside every checkpoint, so sampling, evaluation and the service
rebuild the exact model from the checkpoint directory alone. `from_json` tolerates keys that an
older checkpoint lacks (they take today's defaults) and rejects unknown keys, so a typo never
passes silently. The named configs (`--preset`) are in `cvae/presets.py`.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, Literal

from cvae.data import specs
from cvae.errors import ConfigError
from cvae.model import registry
from cvae.limits import MAX_SEED

# The choices of each string field, once: validation and the `cvae train` flags read them here.
DataSource = Literal["idx", "torchvision"]
Binarization = Literal["none", "dynamic"]
Architecture = Literal["mlp", "conv"]
Activation = Literal["relu", "gelu", "silu", "elu", "tanh", "leaky_relu"]
LabelConditioning = Literal["first", "every"]
Likelihood = Literal["bernoulli", "gaussian", "logistic"]
KLSchedule = Literal["constant", "linear"]
Optimizer = Literal["adam", "adamw", "sgd", "rmsprop"]
LRSchedule = Literal["constant", "linear", "cosine", "warmup_cosine", "warmup_linear"]
Freeze = Literal["none", "encoder", "decoder"]
Prior = Literal["standard", "mixture", "vamp", "learned_mixture"]
Objective = Literal["elbo", "iwae", "dreg"]
PriorCodes = Literal["samples", "means"]

MAX_STOCHASTIC_LAYERS = 5  # the ladder VAE's depth on MNIST in Sonderby et al. 2016
MAX_IMPORTANCE_SAMPLES = 256  # training's K; evaluation's IWAE K is a `cvae eval` flag


def setting(default: Any, doc: str) -> Any:
    """A config field with its one-sentence doc, which `cvae train --help` shows for its flag."""
    return dataclasses.field(default=default, metadata={"doc": doc})


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything that defines a run. Field names are the `cvae train` flags (with dashes)."""

    # Data.
    dataset: str = setting("mnist", "Which dataset to train on: mnist, fashion_mnist, or one "
                                 "prepared by `cvae data --from PATH --name NAME`.")
    data_source: DataSource = setting(
        "idx", "Read the IDX files directly, or through torchvision.datasets (the torch extra).")
    train_limit: int = setting(0, "Train on the first N training examples only (0 = all; for "
                               "smoke runs).")
    validation_size: int = setting(
        1000, "Examples of the training file held out for validation: MNIST's last N (10000 is "
              "the source's own validation set); other datasets draw them by --seed.")
    binarization: Binarization = setting(
        "dynamic", "Bernoulli likelihood only: resample each pixel ~ Bernoulli(intensity) at "
                   "every step (dynamic), or use the intensities as they are (none).")

    # Model.
    model: str = setting(
        "cvae", "Model family (cvae.model.registry): cvae, one latent z; ladder, a ladder VAE "
                "of --stochastic-layers latent layers.")
    architecture: Architecture = setting(
        "mlp", "Encoder and decoder: MLPs only, or with two stride-2 (transposed) convolutions.")
    hidden_sizes: tuple[int, ...] = setting(
        (512, 256), "Widths of the encoder's hidden layers (the decoder mirrors them).")
    latent_dim: int = setting(16, "Dimensions of the latent z.")
    activation: Activation = setting("gelu", "Activation of the hidden layers.")
    label_conditioning: LabelConditioning = setting(
        "every", "Decoder: add the label at its first layer only, or feed it to every layer.")
    prior: Prior = setting(
        "mixture", "p(z|y): N(0, I); a per-class Gaussian mixture fitted to the codes after "
                    "each evaluated epoch, for sampling and evaluation only (training's KL uses "
                    "N(0, I)); or learned with the model: a VampPrior or a per-class mixture.")
    prior_components: int = setting(30, "Components of each class's mixture prior.")
    pseudo_inputs: int = setting(
        50, "With --prior vamp: pseudo-inputs per class; p(z|y) is the mean of q(z|u,y) over "
            "them (Tomczak and Welling 2018).")
    stochastic_layers: int = setting(
        1, "With --model ladder: its latent layers (2 or more), --latent-dim the lowest.")
    upper_latent_dim: int = setting(8, "Dimensions of each ladder layer above the bottom one.")
    prior_codes: PriorCodes = setting(
        "samples", "What the mixture is fitted to: a draw from q(z|x,y) per training image (the "
                   "aggregate posterior: wider samples), or its mean (tighter: more typical).")
    likelihood: Likelihood = setting(
        "bernoulli", "p(x|z,y): Bernoulli (nearly binary grey images), the seed's Gaussian, or a "
                     "discretised logistic over 256 levels (grey-level, colour; docs/model.md).")
    pixel_sharpness: float = setting(
        1.3, "Images are sigmoid(s * pixel logits): the Bernoulli decoder at temperature 1/s "
             "(1 = its means). Rendering only: training and the bounds never see it.")
    truncation: float = setting(
        0.75, "Quantile of N(0, I)'s radius beyond which a sample's noise is pulled in onto it "
             "(1 = off): fewer draws from the prior's tails, where most misread samples are. "
             "Sampling only: training and the bounds never see it.")
    logvar_bound: float = setting(
        8.0, "Soft clamp of the encoder's log-variance to (-bound, bound), so the KL cannot "
             "overflow.")
    dropout_rate: float = setting(0.0, "Dropout after each hidden block while training (0 = off).")
    batch_norm: bool = setting(False, "BatchNorm in each hidden block (statistics kept in the "
                                   "checkpoint).")

    # Objective.
    kl_weight: float = setting(
        1.0, "Beta, the weight of the KL in the loss (1 = the ELBO); above 1 buys class-faithful "
             "samples from the standard prior at some nats (docs/training.md, 'Why beta 1 "
             "and a mixture prior').")
    kl_schedule: KLSchedule = setting(
        "constant", "KL weight over training: constant, or rising linearly from 0 over "
                    "--kl-warmup-steps.")
    kl_warmup_steps: int = setting(0, "Steps of the linear KL warm-up.")
    free_bits: float = setting(
        0.0, "Floor, in nats, on each latent dimension's batch-mean KL in the loss (0 = off).")
    objective: Objective = setting(
        "elbo", "Training bound: the ELBO, or the importance-weighted bound with its plain "
                "gradient (iwae) or the doubly reparameterised one (dreg, Tucker et al. 2019).")
    importance_samples: int = setting(1, "With --objective iwae or dreg: samples K per image.")

    # Optimisation.
    optimizer: Optimizer = setting("adam", "The Optax optimizer.")
    learning_rate: float = setting(1e-3, "Peak learning rate of the schedule.")
    end_learning_rate: float = setting(1e-5, "Learning rate at the end of a decaying schedule.")
    lr_schedule: LRSchedule = setting(
        "warmup_cosine", "Learning rate over the optimizer updates of all epochs.")
    warmup_steps: int = setting(500, "Updates of linear warm-up from 0 for the warmup_* schedules.")
    weight_decay: float = setting(
        0.0, "Weight decay: decoupled for adamw, added to the gradient for the others.")
    momentum: float = setting(0.9, "Momentum of sgd and rmsprop.")
    grad_clip_norm: float = setting(0.0, "Clip gradients to this global norm (0 = no clipping).")
    accumulation_steps: int = setting(
        1, "Micro-batches per optimizer update (optax.MultiSteps); the effective batch is "
           "this times --batch-size.")
    ema_decay: float = setting(
        0.0, "Decay of an exponential moving average of the parameters, used for evaluation "
             "and sampling (0 = none).")
    freeze: Freeze = setting(
        "none", "Keep the encoder or the decoder fixed (e.g. with --init-from).")

    # Loop.
    batch_size: int = setting(128, "Examples per training step (a multiple of the device count).")
    epochs: int = setting(140, "Passes over the training set; the schedules span all of them.")
    schedule_epochs: int = setting(
        0, "Epochs the learning-rate schedule spans (0 = --epochs); a run extended with a "
           "larger --epochs keeps its span and trains on at the schedule's final rate.")
    max_steps: int = setting(0, "Stop after this many (micro-batch) steps (0 = no limit); the "
                             "schedules still span --epochs.")
    seed: int = setting(0, f"Seed of everything random in the run, 0..{MAX_SEED}.")
    steps_per_call: int = setting(50, "Train steps fused into one device call (lax.scan).")
    eval_batch_size: int = setting(1000, "Examples per evaluation batch (memory only, not the "
                                      "result).")
    eval_every: int = setting(10, "Epochs between evaluations, checkpoints and sample grids (and "
                              "after the last epoch).")
    early_stopping_patience: int = setting(
        0, "Stop after this many evaluations without a --early-stopping-min-delta improvement "
           "of the validation loss (0 = off).")
    early_stopping_min_delta: float = setting(
        0.0, "The smallest fall of the validation loss that counts as an improvement.")
    keep_checkpoints: int = setting(3, "Latest checkpoints kept (the best one is kept as well).")

    # Semi-supervised (Kingma et al. 2014, M2): few labels, the label a latent for the rest.
    labels: str = setting(
        "all", "Training labels used: all (a conditional VAE), or N, a multiple of 10: N "
               "class-balanced images keep their labels, the rest train without them, and a "
               "classifier q(y|x) is learnt beside the encoder (docs/semi-supervised.md).")
    classifier_weight: float = setting(
        0.1, "Weight of the labelled images' mean cross-entropy of q(y|x) against the loss per "
             "training image: the paper's alpha = 0.1 * N on its objective summed over the N "
             "training images.")
    labelled_per_batch: int = setting(
        16, "With --labels N: labelled images in each batch (the rest unlabelled), cycled "
            "through the N within an epoch.")
    classifier_shift: int = setting(
        0, "With --labels N: q(y|x) reads each training image moved by up to this many pixels "
           "each way, a fresh random shift every step (0 = as it is).")
    consistency_weight: float = setting(
        0.0, "With --labels N and --classifier-shift: weight of the squared difference between "
             "q(y|x)'s readings of two shifts of each unlabelled image (0 = off).")
    entropy_weight: float = setting(0.0, "With --labels N: weight of the unlabelled images' mean "
                                      "entropy of q(y|x), minimised (0 = off).")
    vat_weight: float = setting(
        0.0, "With --labels N: weight of virtual adversarial training's term (Miyato et al. "
             "2018): q(y|x)'s divergence at the nearby image that changes it most (0 = off).")
    vat_epsilon: float = setting(
        0.3, "With --vat-weight: the L2 length of that nearby image's offset, pixels in [0, 1] "
             "(0.3: the paper's for MNIST with 100 labels).")

    def validate(self) -> Config:
        """Raise ConfigError naming the first bad field; return self so calls chain."""
        for name in CHOICES:
            if getattr(self, name) not in CHOICES[name]:
                raise ConfigError(f"{name}={getattr(self, name)!r}: "
                                  f"allowed {', '.join(CHOICES[name])}")
        if self.dataset not in specs.known_names():
            raise ConfigError(f"dataset={specs.not_prepared(self.dataset)}")
        positive_ints = ("latent_dim", "batch_size", "steps_per_call", "eval_batch_size",
                         "eval_every", "prior_components", "accumulation_steps",
                         "keep_checkpoints", "epochs", "importance_samples", "pseudo_inputs",
                         "stochastic_layers", "upper_latent_dim")
        for name in positive_ints:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be >= 1")
        non_negative = ("train_limit", "max_steps", "kl_warmup_steps", "warmup_steps",
                        "early_stopping_patience", "kl_weight", "free_bits", "weight_decay",
                        "grad_clip_norm", "early_stopping_min_delta", "seed", "validation_size",
                        "schedule_epochs", "classifier_weight", "consistency_weight",
                        "entropy_weight", "vat_weight")
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
        if not 0 < self.pixel_sharpness <= 10:
            raise ConfigError(f"pixel_sharpness={self.pixel_sharpness}: must be in (0, 10]")
        if not 0 < self.truncation <= 1:
            raise ConfigError(f"truncation={self.truncation}: must be in (0, 1]")
        if not 0 < self.logvar_bound <= 30:
            raise ConfigError(f"logvar_bound={self.logvar_bound}: must be in (0, 30]")
        self._validate_labels()
        self._validate_model_levers()
        return self

    def _validate_model_levers(self) -> None:
        for name, high in (("stochastic_layers", MAX_STOCHASTIC_LAYERS),
                           ("importance_samples", MAX_IMPORTANCE_SAMPLES)):
            if getattr(self, name) > high:
                raise ConfigError(f"{name}={getattr(self, name)}: must be in [1, {high}]")
        if self.objective == "elbo" and self.importance_samples != 1:
            raise ConfigError(f"importance_samples={self.importance_samples}: only with "
                              f"--objective iwae or dreg (the ELBO draws one sample)")
        if self.objective != "elbo" and self.free_bits > 0:
            raise ConfigError(f"free_bits={self.free_bits}: only with --objective elbo (the "
                              f"importance-weighted bound has no KL term to floor)")
        if self.model not in registry.names():
            raise ConfigError(f"model={self.model!r}: allowed {', '.join(registry.names())}")
        if (self.model == "ladder") != (self.stochastic_layers > 1):
            raise ConfigError(f"stochastic_layers={self.stochastic_layers}: --model ladder "
                              f"takes 2 or more latent layers, the other families one")

    def _validate_labels(self) -> None:
        classes = self.spec.num_classes
        if self.labels != "all" and not (self.labels.isdigit() and int(self.labels) > 0
                                         and int(self.labels) % classes == 0):
            raise ConfigError(f"labels={self.labels!r}: must be all, or a positive multiple of "
                              f"{classes} (the same number of each class)")
        if not 0 <= self.classifier_shift <= 8:
            raise ConfigError(f"classifier_shift={self.classifier_shift}: must be in [0, 8]")
        if self.vat_epsilon <= 0:
            raise ConfigError(f"vat_epsilon={self.vat_epsilon}: must be > 0")
        if self.labels != "all" and not 1 <= self.labelled_per_batch < self.batch_size:
            raise ConfigError(f"labelled_per_batch={self.labelled_per_batch}: must be in "
                              f"[1, batch_size - 1 = {self.batch_size - 1}]")

    @property
    def spec(self) -> specs.DatasetSpec:
        """The dataset's spec: its image shape, class count and names (`cvae.data.specs`)."""
        return specs.spec_of(self.dataset)

    @property
    def labelled_count(self) -> int | None:
        """How many training images keep their labels; None = all of them."""
        return None if self.labels == "all" else int(self.labels)

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)

    def drawn_at(self, truncation: float | None) -> Config:
        """This config, its samples truncated at `truncation` (None: at its own): what the
        `--truncation` of `cvae sample`, `cvae serve`, `cvae export` and `cvae eval` loads.
        Sampling only, so the weights serve unchanged."""
        return self if truncation is None else self.replace(truncation=truncation)

    def drawing(self) -> dict[str, float]:
        """How this config draws and renders its samples (`DRAWING_FIELDS`): what two sets of
        sample figures of the same weights must share to be the same figures."""
        return {name: getattr(self, name) for name in DRAWING_FIELDS}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Config:
        """Keys missing from `values` (older checkpoints) take what those checkpoints did
        (`ABSENT_MEANS`), else the defaults; unknown keys fail."""
        values = {**{k: v for k, v in ABSENT_MEANS.items() if k not in values}, **values}
        if "model" not in values:  # stored before families had names: the depth said which
            values["model"] = "ladder" if int(values.get("stochastic_layers", 1)) > 1 else "cvae"
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(f"unknown config field(s): {', '.join(unknown)}")
        kwargs = {name: coerce(HINTS[name], value, name) for name, value in values.items()}
        return cls(**kwargs).validate()

    @classmethod
    def from_json(cls, text: str) -> Config:
        return cls.from_dict(json.loads(text))

    def diff(self, other: Config, fields: tuple[str, ...] | None = None) -> dict[str, tuple]:
        """Fields (optionally restricted to `fields`) whose values differ: name -> (self, other)."""
        names = fields or tuple(f.name for f in dataclasses.fields(self))
        return {n: (getattr(self, n), getattr(other, n)) for n in names
                if getattr(self, n) != getattr(other, n)}


HINTS = typing.get_type_hints(Config)
# Field name -> allowed values, for every field typed as a Literal. `dataset` is not among
# them: a prepared dataset of one's own is registered at run time (`cvae.data.specs.register`).
CHOICES: dict[str, tuple[str, ...]] = {name: typing.get_args(hint) for name, hint in HINTS.items()
                                       if typing.get_origin(hint) is Literal}


def field_doc(name: str) -> str:
    """The one-sentence doc of config field `name`."""
    return next(f.metadata["doc"] for f in dataclasses.fields(Config) if f.name == name)


def flag(name: str) -> str:
    """The `cvae train` flag of config field `name`."""
    return "--" + name.replace("_", "-")


def as_flags(fields: dict[str, Any]) -> list[str]:
    """`cvae train` flags that set these config fields to these values."""
    flags = []
    for name, value in fields.items():
        if isinstance(value, bool):
            flags.append(flag(name) if value else "--no-" + flag(name)[2:])
        else:
            flags += [flag(name), ",".join(map(str, value)) if isinstance(value, tuple)
                      else str(value)]
    return flags


# What a field missing from a stored config means, where the code that wrote it differs from
# today's default: no validation split (they trained on the whole training file; resuming
# them needs --fresh), N(0, I), which every checkpoint before the mixture prior sampled, the
# decoder's plain means, which every checkpoint before the sharpness rendered, and no
# truncation, which none before it had.
ABSENT_MEANS: dict[str, Any] = {"validation_size": 0, "prior": "standard",
                                "pixel_sharpness": 1.0, "truncation": 1.0}

# Fields that change only how samples are drawn and rendered, never the weights.
DRAWING_FIELDS = ("pixel_sharpness", "truncation")

# Fields a resumed run may change; every other one decides the parameter shapes, the optimizer
# state, the data order or the objective, so it must match the checkpoint. (`schedule_epochs`
# is checked on its own: `cvae.training.start.keep_schedule_span`.)
RESUMABLE_CHANGES = ("epochs", "schedule_epochs", "max_steps", "steps_per_call",
                     "eval_batch_size", "eval_every", "early_stopping_patience",
                     "early_stopping_min_delta", "keep_checkpoints", "data_source",
                     *DRAWING_FIELDS)


def coerce(hint: Any, value: Any, name: str) -> Any:
    """Convert a JSON or command-line value to the field's declared (resolved) type."""
    try:
        if typing.get_origin(hint) is tuple:
            if isinstance(value, str):
                value = [v for v in value.replace(",", " ").split() if v]
            return tuple(int(v) for v in value)
        if hint is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if hint is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if hint is float:
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r}: not a valid {getattr(hint, '__name__', hint)}")


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
