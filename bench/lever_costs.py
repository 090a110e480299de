"""What each model option (objective, prior, ladder) costs per training step, against the ELBO.

    python -m bench.lever_costs [--steps 50] [--rounds 4] [--batch-size 128] [--quick]

Every candidate is a jitted Adam step of its own loss, scanned over `--steps` steps per call as
the training loop's chunk is, on the default model's sizes (MLP 784-512-256, latent 16, batch
128, Bernoulli): the one-latent CVAE with the ELBO, IWAE and DReG with K = 5, a two-layer ladder
VAE (16 + 8) with the ELBO and with DReG K = 5, the hierarchical family at its own defaults
with the ELBO, a VampPrior (50 pseudo-inputs a class: 500 encoder rows a step) and a learned
mixture (10 components a class). Each loss is the training
step's own (`objectives.row_terms` and `objectives.batch_loss` on the family's terms, as
`cvae.training.supervision.FullLabels.loss` takes them), so the ratios compare like with like.
Candidates run in interleaved rounds (bench/rounds.py) and each ratio to the ELBO step is the
median of the per-round ratios, so a drifting, shared machine hits both sides alike. Prints
milliseconds per step and the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax

from bench.rounds import interleaved, median_ratio
from cvae.config import presets
from cvae.data.synthetic import synthetic_images
from cvae.model import objectives
from cvae.model.registry import create_model, init_variables

K = 5


def candidate(config):
    """(init_fn(key) -> params, loss_fn(params, x, y, key) -> scalar): the training step's loss
    of `config`'s model and objective, at KL weight 1 without free bits."""
    model = create_model(config)

    def init(key):
        return init_variables(model, key)["params"]

    def loss(params, x, y, key):
        noise = objectives.draw_noise(key, model, samples=config.objective.importance_samples,
                                      batch=x.shape[0])
        rows, _, _ = objectives.row_terms(model, {"params": params}, images=x, labels=y,
                                          noise=noise, objective=config.objective.bound,
                                          kl_weight=1.0)
        return objectives.batch_loss(rows, objective=config.objective.bound, kl_weight=1.0,
                                     free_bits=0.0)[0]

    return init, loss


def cvae_losses(config):
    """{name: (init_fn, loss_fn)} of the one-latent CVAE's options."""
    config = config.replace(free_bits=0.0)
    return {"elbo": candidate(config),
            f"iwae-k{K}": candidate(config.replace(objective="iwae", importance_samples=K)),
            f"dreg-k{K}": candidate(config.replace(objective="dreg", importance_samples=K)),
            "vamp-50": candidate(config.replace(prior="vamp", pseudo_inputs=50)),
            "learned-mixture-10": candidate(config.replace(prior="learned_mixture",
                                                           prior_components=10))}


def ladder_losses(config):
    """{name: (init_fn, loss_fn)} of a two-layer ladder (the top layer 8 wide)."""
    ladder = config.replace(model="ladder", stochastic_layers=2, upper_latent_dim=8,
                            free_bits=0.0)
    return {"ladder-2": candidate(ladder),
            f"ladder-2-dreg-k{K}": candidate(ladder.replace(objective="dreg",
                                                            importance_samples=K))}


def hierarchical_losses(config):
    """{name: (init_fn, loss_fn)} of the hierarchical family at its own options' defaults."""
    return {"hierarchical": candidate(config.replace(model="hierarchical", free_bits=0.0))}


def create_chunk(init_fn, loss_fn, x, y, steps: int):
    """A jitted `chunk(params, opt_state, key) -> (params, opt_state)` of `steps` Adam steps."""
    tx = optax.adam(1e-3)

    @jax.jit
    def chunk(params, opt_state, key):
        def body(carry, i):
            params, opt_state = carry
            grads = jax.grad(loss_fn)(params, x, y, jax.random.fold_in(key, i))
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), None

        return jax.lax.scan(body, (params, opt_state), jnp.arange(steps))[0]

    params = init_fn(jax.random.key(0))
    return chunk, params, tx.init(params)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 rounds of 5 steps")
    options = parser.parse_args(argv)
    config = presets.default().replace(prior="standard")
    if options.quick:
        config = presets.test()
        options.steps, options.rounds, options.batch_size = 5, 2, 16
    labels = jnp.arange(options.batch_size, dtype=jnp.int32) % 10
    x = (jnp.asarray(synthetic_images(labels.tolist()).reshape(-1, 784)) > 127).astype(
        jnp.float32)
    candidates, compile_seconds = {}, {}
    for name, (init_fn, loss_fn) in {**cvae_losses(config), **ladder_losses(config),
                                     **hierarchical_losses(config)}.items():
        chunk, params, opt_state = create_chunk(init_fn, loss_fn, x, labels, options.steps)
        start = time.perf_counter()
        jax.block_until_ready(chunk(params, opt_state, jax.random.key(1)))
        compile_seconds[name] = time.perf_counter() - start

        def run(chunk=chunk, params=params, opt_state=opt_state):
            start = time.perf_counter()
            jax.block_until_ready(chunk(params, opt_state, jax.random.key(2)))
            return (time.perf_counter() - start) / options.steps

        candidates[name] = run
    load_start = os.getloadavg()[0]
    times = interleaved(candidates, options.rounds)
    print(f"{options.rounds} interleaved rounds of {options.steps} steps, batch "
          f"{options.batch_size}, {os.cpu_count()} cores, load average {load_start:.1f} -> "
          f"{os.getloadavg()[0]:.1f}; JAX {jax.__version__} {jax.default_backend()}")
    print("| lever | ms/step (median) | x ELBO step | first call s (compile) |")
    print("|---|---:|---:|---:|")
    for name, values in times.items():
        print(f"| {name} | {1000 * statistics.median(values):.1f} | "
              f"{median_ratio(values, times['elbo']):.2f} | {compile_seconds[name]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
