"""The settings `cvae train --dataset NAME` picks from the data when nothing sets them: the
likelihood from the pixels, the validation split from the data set's size, and the epochs from
a stated time on this machine. A preset, a `--config` file or a flag always wins: only the
settings nobody gave are chosen, and each choice comes with its reason, printed in one block,
kept in the run record and shown by `--print-config`.

- Likelihood: nearly binary grey images (few pixels between the ends of the scale, as MNIST's
  ink on paper) get the Bernoulli over binarised pixels; grey-level and colour images get the
  discretised logistic mixture over the 256 levels (PixelCNN++'s).
- Architecture: colour images of `CONV_SIDE` or more a side, whose sides halve twice, get the
  convolutional encoder and decoder (`architecture="conv"`): there the MLP's output layer
  grows with the pixels (about 100 million weights at 64x64 RGB) and its step is the slower
  one, while the conv model's spatial structure drew the emoji nearer the real ones at the
  same time (experiments/configs/emoji_conv.py). Grey and smaller images keep the MLP, which
  drew Fashion-MNIST nearer than the conv model at the same time.
- Sharpness, wherever the run's likelihood is the mixture (chosen, or given by a flag or a
  file): each pixel rendered from near its likeliest component (`MIXTURE_SHARPNESS`), not the
  mixture's mean, which blends a pixel's modes into grey.
- Validation: a tenth of the training images, at most the default's 1,000 and at least one.
- Epochs: as many as fit `TIME_BUDGET_SECONDS` at the cost of a training step timed on this
  machine as training runs it (cvae/training/step_cost.py), at most the default's, for every
  family and architecture. MNIST's default is nearly binary, 28x28
  and 59,000 images, so nothing is chosen for it: it trains as it always has, bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from cvae.config.components import LIKELIHOOD_NAME, with_options
from cvae.config.sections import RESUMABLE_CHANGES, Config
from cvae.data.profile import DataProfile
from cvae.model.layers import unfit_conv_sides
from cvae.training.step_cost import StepCost, measure_step

NEARLY_BINARY = 0.15  # the largest share of pixels between the ends a Bernoulli takes
MIXTURE_COMPONENTS = 5  # logistics a pixel for the chosen mixture (PixelCNN++: 10 on CIFAR)
COMPONENTS = "likelihood.options.mixture_components"
# The chosen mixture's rendering: each pixel's components weighed by weight^10, nearly its
# likeliest one. On Fashion-MNIST its samples' FD was 1.64 against the mixture mean's 3.90,
# recall 0.66 against 0.54 (one seed's checkpoint rendered both ways: experiments/LOG.md).
MIXTURE_SHARPNESS = 10.0
CONV_SIDE = 64  # the smallest side of colour images that get the conv model
TIME_BUDGET_SECONDS = 30 * 60  # what the chosen epochs aim to fit on this machine
SETTINGS = (LIKELIHOOD_NAME, "model.options.architecture", "drawing.pixel_sharpness",
            "data.validation_size", "run.epochs")


@dataclasses.dataclass(frozen=True)
class Choices:
    """What was chosen (settings by path) and why, one line a setting."""

    changes: dict
    reasons: tuple[str, ...]

    def describe(self, dataset: str) -> str:
        if not self.reasons:
            return ""
        return "\n".join([f"cvae train chose from the data ({dataset}):",
                          *(f"  {reason}" for reason in self.reasons)])


def choose(config: Config, data: DataProfile, *, given: set[str],
           step_cost: Callable[[Config, DataProfile], StepCost] = measure_step,
           resumed: Config | None = None, held: dict | None = None) -> Choices:
    """The settings of `SETTINGS` that `given` (paths set by a preset, a file or a flag) does
    not hold, chosen for `data`; `step_cost` times a step of the chosen model here when the
    epochs are to be chosen (cvae/training/step_cost.py). A run that resumes
    (`resumed`: the config of the checkpoint it continues) keeps the epochs it chose when it
    started, whatever the machine's speed now: a stopped run ends where it would have.
    `held`: the likelihood's options given by flags (by path) without its name, set on the
    likelihood the run ends with (ConfigError, saying why it is that one, where it has none)."""
    held = held or {}
    changes, reasons = {}, []
    binary = data.channels == 1 and data.between_share <= NEARLY_BINARY
    share = f"{100 * data.between_share:.0f}% of pixel values between the ends"
    if LIKELIHOOD_NAME in given:
        decided = "its preset's"
    elif not binary:
        changes[LIKELIHOOD_NAME] = "logistic_mixture"
        components = f"{held.get(COMPONENTS, MIXTURE_COMPONENTS)} components"
        if COMPONENTS in held:
            components += " (given)"
        else:
            changes[COMPONENTS] = MIXTURE_COMPONENTS
        kind = "colour" if data.channels == 3 else "grey-level"
        why = f"{kind} images ({share}); a Bernoulli needs nearly binary ones"
        decided = f"chosen from the data: {why}"
        reasons.append(f"likelihood  logistic_mixture, {components}: {why}")
    else:
        why = f"nearly binary grey images ({share})"
        decided = f"chosen from the data: {why}"
        reasons.append(f"likelihood  {config.likelihood.name}: {why}")
    settled = config.updated(changes)
    if held:  # the likelihood's options given without its name: set on the one decided above
        settled = with_options(settled, "likelihood", held, decided=decided)
        changes.update(held)
    likelihood = settled.likelihood  # chosen, or given by a flag or a file
    if likelihood.component.blends_modes and "drawing.pixel_sharpness" not in given:
        changes["drawing.pixel_sharpness"] = MIXTURE_SHARPNESS
        reasons.append(f"sharpness   {MIXTURE_SHARPNESS:g}: each pixel drawn from near its "
                       "likeliest component, not a blend of them (rendering only)")
    if convolutional(config, data, given):
        changes["model.options.architecture"] = "conv"
        reasons.append(f"model       the conv encoder and decoder: {data.height}x{data.width} "
                       "colour images, where an MLP's output layer grows with the pixels")
    if "data.validation_size" not in given:
        size = max(1, min(config.data.validation_size, data.images // 10))
        if size != config.data.validation_size:
            changes["data.validation_size"] = size
            reasons.append(f"validation  {size} images: a tenth of the {data.images}")
    chosen = config.updated(changes)
    if resumed is not None and set(resumed.diff(chosen)) - set(RESUMABLE_CHANGES):
        resumed = None  # another run's folder: training will refuse it, so choose as if fresh
    if "run.epochs" not in given and resumed is not None:
        changes["run.epochs"] = resumed.run.epochs
        changes["run.eval_every"] = resumed.run.eval_every
        reasons.append(f"epochs      {resumed.run.epochs}: those of the run it resumes, "
                       "chosen when it started")
    elif "run.epochs" not in given:
        cost = step_cost(chosen, data)
        steps = (data.images - chosen.data.validation_size) / chosen.run.batch_size
        seconds = cost.seconds * steps  # an epoch
        epochs = max(1, min(config.run.epochs, math.floor(TIME_BUDGET_SECONDS / seconds)))
        if epochs != config.run.epochs:
            changes["run.epochs"] = epochs
            changes["run.eval_every"] = max(1, epochs // 14)
        minutes = round(epochs * seconds / 60)
        spent = (f"about {minutes} minute{'s' * (minutes != 1)}" if minutes
                 else "under a minute")
        reasons.append(f"epochs      {epochs}: {spent} here, a training step of batch "
                       f"{chosen.run.batch_size} timed at {1000 * cost.seconds:.0f} ms ("
                       f"{cost.steps} steps in {cost.calls} calls, the median call's; at most "
                       f"{TIME_BUDGET_SECONDS // 60} minutes, at most {config.run.epochs})")
    return Choices(changes, tuple(reasons))


def convolutional(config: Config, data: DataProfile, given: set[str]) -> bool:
    """Whether to choose the conv encoder and decoder: large colour images whose sides halve
    twice, for a family that has the option, when neither it nor the family was given."""
    return (not {"model.name", "model.options.architecture"} & given
            and getattr(config.model.options, "architecture", "conv") != "conv"
            and data.channels == 3 and min(data.height, data.width) >= CONV_SIDE
            and not unfit_conv_sides(data.height, data.width))
