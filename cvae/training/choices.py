"""The settings `cvae train --dataset NAME` picks from the data when nothing sets them: the
likelihood from the pixels, the validation split from the data set's size, and the epochs from
a stated time on this machine. A preset, a `--config` file or a flag always wins: only the
settings nobody gave are chosen, and each choice comes with its reason, printed in one block,
kept in the run record and shown by `--print-config`.

- Likelihood: nearly binary grey images (few pixels between the ends of the scale, as MNIST's
  ink on paper) get the Bernoulli over binarised pixels; grey-level and colour images get the
  discretised logistic mixture over the 256 levels (PixelCNN++'s).
- Sharpness, where it chooses the mixture: each pixel rendered from near its likeliest component
  (`MIXTURE_SHARPNESS`), not the mixture's mean, which blends a pixel's modes into grey.
- Validation: a tenth of the training images, at most the default's 1,000 and at least one.
- Epochs: as many as fit `TIME_BUDGET_SECONDS` at this machine's measured matrix rate and the
  efficiency the default reaches, at most the default's. MNIST's default is nearly binary, 28x28
  and 59,000 images, so nothing is chosen for it: it trains as it always has, bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
import time

from cvae.config.sections import RESUMABLE_CHANGES, Config
from cvae.data.profile import DataProfile
from cvae.model.registry import noise_dim

NEARLY_BINARY = 0.15  # the largest share of pixels between the ends a Bernoulli takes
MIXTURE_COMPONENTS = 5  # logistics a pixel for the chosen mixture (PixelCNN++: 10 on CIFAR)
# The chosen mixture's rendering: each pixel's components weighed by weight^10, nearly its
# likeliest one. On Fashion-MNIST its samples' FD was 1.64 against the mixture mean's 3.90,
# recall 0.66 against 0.54 (one seed's checkpoint rendered both ways: experiments/LOG.md).
MIXTURE_SHARPNESS = 10.0
TIME_BUDGET_SECONDS = 30 * 60  # what the chosen epochs aim to fit on this machine
# The share of the matrix rate the MLP families' training step reaches on 2 CPU cores
# (the default: 140 epochs of 59,000 digits in about 4 minutes at 470 GFLOP/s).
STEP_EFFICIENCY = 0.4
SETTINGS = ("likelihood.name", "drawing.pixel_sharpness", "data.validation_size", "run.epochs")


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
           gemm_gflops: float | None = None, resumed: Config | None = None) -> Choices:
    """The settings of `SETTINGS` that `given` (paths set by a preset, a file or a flag) does
    not hold, chosen for `data`; `gemm_gflops` measured if None and needed. A run that resumes
    (`resumed`: the config of the checkpoint it continues) keeps the epochs it chose when it
    started, whatever the machine's speed now: a stopped run ends where it would have."""
    changes, reasons = {}, []
    binary = data.channels == 1 and data.between_share <= NEARLY_BINARY
    share = f"{100 * data.between_share:.0f}% of pixel values between the ends"
    if "likelihood.name" not in given and not binary:
        changes["likelihood.name"] = "logistic_mixture"
        changes["likelihood.options.mixture_components"] = MIXTURE_COMPONENTS
        kind = "colour" if data.channels == 3 else "grey-level"
        reasons.append(f"likelihood  logistic_mixture, {MIXTURE_COMPONENTS} components: "
                       f"{kind} images ({share}); a Bernoulli needs nearly binary ones")
        if "drawing.pixel_sharpness" not in given:  # the chosen mixture's rendering
            changes["drawing.pixel_sharpness"] = MIXTURE_SHARPNESS
            reasons.append(f"sharpness   {MIXTURE_SHARPNESS:g}: each pixel drawn from near its "
                           "likeliest component, not a blend of them (rendering only)")
    elif "likelihood.name" not in given:
        reasons.append(f"likelihood  {config.likelihood.name}: nearly binary grey images "
                       f"({share})")
    if "data.validation_size" not in given:
        size = max(1, min(config.data.validation_size, data.images // 10))
        if size != config.data.validation_size:
            changes["data.validation_size"] = size
            reasons.append(f"validation  {size} images: a tenth of the {data.images}")
    chosen = config.updated(changes)
    flops = epoch_flops(chosen, data, data.images - chosen.data.validation_size)
    if resumed is not None and set(resumed.diff(chosen)) - set(RESUMABLE_CHANGES):
        resumed = None  # another run's folder: training will refuse it, so choose as if fresh
    if "run.epochs" not in given and flops > 0 and resumed is not None:
        changes["run.epochs"] = resumed.run.epochs
        changes["run.eval_every"] = resumed.run.eval_every
        reasons.append(f"epochs      {resumed.run.epochs}: those of the run it resumes, "
                       "chosen when it started")
    elif "run.epochs" not in given and flops > 0:
        rate = gemm_gflops or matrix_rate()
        seconds = flops / (rate * 1e9 * STEP_EFFICIENCY)
        epochs = max(1, min(config.run.epochs, math.floor(TIME_BUDGET_SECONDS / seconds)))
        if epochs != config.run.epochs:
            changes["run.epochs"] = epochs
            changes["run.eval_every"] = max(1, epochs // 14)
        minutes = round(epochs * seconds / 60)
        reasons.append(f"epochs      {epochs}: about {minutes} minute{'s' * (minutes != 1)} at "
                       f"this machine's {rate:.0f} GFLOP/s (at most "
                       f"{TIME_BUDGET_SECONDS // 60} minutes, at most {config.run.epochs})")
    return Choices(changes, tuple(reasons))


def epoch_flops(config: Config, data: DataProfile, images: int) -> float:
    """The matrix products of one epoch's training steps (forward and backward: 3 times the
    forward's), from the MLP families' widths; 0 for a family without `hidden_sizes`."""
    options = config.model.options
    widths = getattr(options, "hidden_sizes", None)
    if widths is None:
        return 0.0
    outputs = config.likelihood.component.output_channels(config.likelihood.options,
                                                          data.channels)
    encoder = (data.values + data.classes, *widths, 2 * noise_dim(config))
    decoder = (noise_dim(config) + data.classes, *reversed(widths),
               data.height * data.width * outputs)
    per_image = sum(2 * a * b for layers in (encoder, decoder)
                    for a, b in zip(layers, layers[1:]))
    return 3.0 * per_image * images


def matrix_rate(size: int = 1024, repeats: int = 5) -> float:
    """This machine's float32 matrix product rate, GFLOP/s (the median of `repeats`; process
    0's in a run of several). It runs on JAX's backend: a run joins the distributed runtime
    before, since that must come first."""
    import jax
    import jax.numpy as jnp

    from cvae.training import processes

    a = jnp.ones((size, size), jnp.float32)
    dot = jax.jit(jnp.dot)
    dot(a, a).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dot(a, a).block_until_ready()
        times.append(time.perf_counter() - start)
    rate = 2.0 * size**3 / sorted(times)[len(times) // 2] / 1e9
    return processes.from_process_zero(rate)  # every process of a run chooses alike
