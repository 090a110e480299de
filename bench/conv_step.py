"""Why `--architecture conv` has its own backward pass: one Adam step of the conv model, timed
called alone and inside a `lax.scan` of steps (as `cvae train` runs them), with JAX's own
gradient of flax's convolutions against cvae's (cvae/model/convolution.py).

    python -m bench.conv_step [--rounds 3] [--steps 4]

Interleaved rounds (each variant once a round), medians; the figures are ms a step, batch 128,
random binary images. docs/model.md quotes them.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import optax

from cvae.config import presets
from cvae.model import convolution
from cvae.model.registry import create_model, init_variables

BATCH = 128


def flax_gradient() -> dict:
    """`convolution.CONVOLVE` with JAX's own gradient of the same convolutions."""
    return {transpose: functools.partial(convolution.as_flax, transpose=transpose)
            for transpose in (False, True)}


def step_fns(steps: int):
    """(alone, scanned): jitted (params, opt_state, images) -> ..., `steps` steps when scanned."""
    model = create_model(presets.default().replace(architecture="conv"))
    variables = init_variables(model, jax.random.key(0))
    optimizer = optax.adam(1e-3)

    noise = jax.random.normal(jax.random.key(1), (1, BATCH, model.noise_dim))

    def loss(params, images):  # the reconstruction: -log p(x | z, y), summed sigmoid BCE
        terms = model.apply({**variables, "params": params}, images,
                            jnp.zeros(BATCH, jnp.int32), noise, method="terms")
        return -terms.log_px.mean()

    def step(carry, images):
        params, state = carry
        grads = jax.grad(loss)(params, images)
        updates, state = optimizer.update(grads, state, params)
        return (optax.apply_updates(params, updates), state), None

    alone = jax.jit(lambda p, s, x: step((p, s), x[0])[0])
    scanned = jax.jit(lambda p, s, x: jax.lax.scan(step, (p, s), x)[0])
    params = variables["params"]
    images = jax.random.bernoulli(jax.random.key(2), 0.2, (steps, BATCH, 784)).astype(
        jnp.float32)
    return alone, scanned, (params, optimizer.init(params), images)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    variants = {}
    ours = dict(convolution.CONVOLVE)
    for name, convolve in (("flax's gradient", flax_gradient()), ("cvae's gradient", ours)):
        convolution.CONVOLVE.update(convolve)  # read when the step is traced, below
        alone, scanned, inputs = step_fns(args.steps)
        for fn, where, steps in ((alone, "alone", 1), (scanned, "in a scan", args.steps)):
            jax.block_until_ready(fn(*inputs))  # compile now, with this variant's rule
            variants[f"{name}, {where}"] = (fn, inputs, steps)
    convolution.CONVOLVE.update(ours)
    times = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (fn, inputs, steps) in variants.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*inputs))
            times[name].append((time.perf_counter() - start) / steps * 1e3)
    print("| conv model, batch 128 | ms a step (median) | rounds |\n|---|---:|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.1f} | "
              f"{', '.join(f'{v:.1f}' for v in values)} |")


if __name__ == "__main__":
    main()
