"""What one training step of the MLP families costs on this machine: what the epochs that
`cvae train` chooses (cvae/training/choices.py) are sized by.

Three parts, because they do not scale alike from one machine or one data set to another:
- the matrix products (counted from the widths), at `MATRIX_EFFICIENCY` of the machine's
  measured float32 matrix rate;
- the likelihood's work per pixel value, forward and backward (a 5-component mixture on 64x64
  RGB: 26 million decoder outputs a batch), timed here on `TIMED_ROWS` rows of the data's own
  shape and scaled to the batch;
- the optimizer's pass over the weights (gradient clipping and Adam), timed here on
  `TIMED_WEIGHTS` weights and scaled to the model's.
Counting the matrix products alone put a 64x64 colour step at half its time, and on a machine
whose matrix rate is high a 28x28 grey one too (experiments/LOG.md, 2026-11-30).

Synopsis:

    cost = measure_step(config, data)       # StepCost(matrix=..., pixels=..., weights=...)
    epochs = budget_seconds // (cost.seconds * steps_per_epoch)
"""

from __future__ import annotations

import dataclasses
import time

from cvae.config.sections import Config
from cvae.data.profile import DataProfile
from cvae.model.registry import noise_dim

# The share of the matrix rate the MLP families' matrix products reach in a training step on 2
# CPU cores, with the other two parts timed apart (the quiet 2-core AMD EPYC's Fashion-MNIST
# step: 0.039 s of products at the full rate, 0.036 s of mixture, 0.026 s of Adam, 0.146 s in
# all: experiments/LOG.md).
MATRIX_EFFICIENCY = 0.5
TIMED_ROWS = 16
TIMED_WEIGHTS = 1 << 22
REPEATS = 3


@dataclasses.dataclass(frozen=True)
class StepCost:
    """Seconds of one training step at the config's batch, by part; and the matrix rate."""

    matrix: float
    pixels: float
    weights: float
    gemm_gflops: float

    @property
    def seconds(self) -> float:
        return self.matrix + self.pixels + self.weights


def layer_widths(config: Config, data: DataProfile) -> tuple[tuple[int, ...], ...] | None:
    """The encoder's and decoder's layer widths, inputs to outputs (None: not an MLP family)."""
    widths = getattr(config.model.options, "hidden_sizes", None)
    if widths is None:
        return None
    outputs = config.likelihood.component.output_channels(config.likelihood.options,
                                                          data.channels)
    encoder = (data.values + data.classes, *widths, 2 * noise_dim(config))
    decoder = (noise_dim(config) + data.classes, *reversed(widths),
               data.height * data.width * outputs)
    return encoder, decoder


def image_flops(config: Config, data: DataProfile) -> float:
    """The matrix products of training on one image (forward and backward: 3 times the
    forward's); 0 for a family without `hidden_sizes`."""
    layers = layer_widths(config, data)
    if layers is None:
        return 0.0
    return 3.0 * sum(2 * a * b for widths in layers for a, b in zip(widths, widths[1:]))


def weight_count(config: Config, data: DataProfile) -> int:
    layers = layer_widths(config, data) or ()
    return sum(a * b + b for widths in layers for a, b in zip(widths, widths[1:]))


def measure_step(config: Config, data: DataProfile, *,
                 gemm_gflops: float | None = None) -> StepCost:
    """The three parts of one step of `config` on `data` here (a second or two of compiling
    and timing; process 0's figures in a run of several, so every process chooses alike)."""
    from cvae.training import processes

    batch = config.run.batch_size
    rate = gemm_gflops or matrix_rate()
    cost = StepCost(matrix=image_flops(config, data) * batch / (rate * 1e9 * MATRIX_EFFICIENCY),
                    pixels=likelihood_seconds(config, data) * batch / TIMED_ROWS,
                    weights=optimizer_seconds() * weight_count(config, data) / TIMED_WEIGHTS,
                    gemm_gflops=rate)
    return StepCost(*(processes.from_process_zero(value) for value in (
        cost.matrix, cost.pixels, cost.weights, cost.gemm_gflops)))


def _median_seconds(fn, *args, repeats: int = REPEATS) -> float:
    """The median time of `repeats` calls of a jitted `fn` (after one that compiles it)."""
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def likelihood_seconds(config: Config, data: DataProfile) -> float:
    """-log p(x|z) and its gradient on `TIMED_ROWS` rows of the decoder's outputs."""
    import jax
    import jax.numpy as jnp

    from cvae.model import densities

    outputs = layer_widths(config, data)
    width = outputs[1][-1] if outputs else data.height * data.width
    values = jnp.linspace(0.0, 1.0, TIMED_ROWS * data.values, dtype=jnp.float32)
    targets = jnp.round(values * 255).reshape(TIMED_ROWS, data.values) / 255
    logits = jnp.linspace(-2.0, 2.0, TIMED_ROWS * width, dtype=jnp.float32)

    def loss(logits, targets):
        return densities.reconstruction(logits, targets, config.likelihood,
                                        channels=data.channels).sum()

    return _median_seconds(jax.jit(jax.grad(loss)), logits.reshape(TIMED_ROWS, width), targets)


def optimizer_seconds() -> float:
    """Clipping by the global norm, then Adam, on `TIMED_WEIGHTS` weights."""
    import jax
    import jax.numpy as jnp
    import optax

    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    weights = jnp.linspace(-1.0, 1.0, TIMED_WEIGHTS, dtype=jnp.float32)
    state = optimizer.init(weights)

    def step(weights, state, gradient):
        updates, state = optimizer.update(gradient, state, weights)
        return optax.apply_updates(weights, updates), state

    return _median_seconds(jax.jit(step), weights, state, weights * 1e-3)


def matrix_rate(size: int = 1024, repeats: int = 5) -> float:
    """This machine's float32 matrix product rate, GFLOP/s (the median of `repeats`). It runs
    on JAX's backend: a run joins the distributed runtime before, since that must come first."""
    import jax
    import jax.numpy as jnp

    a = jnp.ones((size, size), jnp.float32)
    return 2.0 * size**3 / _median_seconds(jax.jit(jnp.dot), a, a, repeats=repeats) / 1e9
