"""What each model option (objective, prior, ladder) costs per training step, against the ELBO.

    python -m bench.lever_costs [--steps 50] [--rounds 4] [--batch-size 128] [--quick]

Every candidate is a jitted Adam step of its own loss, scanned over `--steps` steps per call as
the training loop's chunk is, on the default model's sizes (MLP 784-512-256, latent 16, batch
128, Bernoulli): the one-latent CVAE with the ELBO (written the same standalone way, so the
ratios compare like with like), IWAE and DReG with K = 5, a two-layer ladder VAE (16 + 8) with
the ELBO and with DReG K = 5, a VampPrior (50 pseudo-inputs a class: 500 encoder rows a step)
and a learned mixture (10 components a class). Candidates run in interleaved rounds
(bench/rounds.py) and each ratio to the ELBO step is the median of the per-round ratios, so
a drifting, shared machine hits both sides alike. Prints milliseconds per step and the ratios.
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
from cvae import presets
from cvae.data.synthetic import synthetic_images
from cvae.model import hierarchical as hv
from cvae.model import learned_prior as lp
from cvae.model import objectives as obj
from cvae.model.losses import reconstruction, vae_loss
from cvae.model.networks import create_model, init_variables, reparameterize

K = 5


def cvae_losses(config):
    """{name: (init_fn(key) -> params, loss_fn(params, x, y, key) -> scalar)} of the CVAE."""
    model = create_model(config)
    def init(key):
        return init_variables(model, key)["params"]

    def apply(params, *args, method):
        return model.apply({"params": params}, *args, method=method)

    def elbo(params, x, y, key):
        logits, mean, logvar = model.apply({"params": params}, x, y, key)
        return vae_loss(logits, x, mean=mean, logvar=logvar, likelihood="bernoulli",
                        kl_weight=1.0)[0]

    def fns(params, x, y, noise):
        def sample_fn(p):
            mean, logvar = apply(p, x, y, method="encode")
            return obj.gaussian_draws(mean, logvar, noise)

        def log_q_fn(p, z):
            return obj.gaussian_log_density(z, *apply(p, x, y, method="encode"))

        def log_joint_fn(p, z):
            flat = z.reshape(-1, z.shape[-1])
            labels = jnp.tile(y, z.shape[0])
            logits = apply(p, flat, labels, method="decode")
            log_px = -reconstruction(logits, jnp.tile(x, (z.shape[0], 1)), "bernoulli")
            return log_px.reshape(z.shape[:2]) + obj.gaussian_log_density(z, 0.0, 0.0)

        return sample_fn, log_q_fn, log_joint_fn

    def iwae(params, x, y, key):
        noise = jax.random.normal(key, (K,) + (x.shape[0], config.latent_dim))
        return -obj.iwae_bound(obj.iwae_log_weights(params, fns(params, x, y, noise))).mean()

    def dreg(params, x, y, key):
        noise = jax.random.normal(key, (K,) + (x.shape[0], config.latent_dim))
        return -obj.dreg_surrogate(*obj.dreg_log_weights(params, fns(params, x, y,
                                                                       noise))).mean()

    def with_prior(prior_module, mixture_of):
        def init_both(key):
            return {"model": init(key), "prior": prior_module.init(key)["params"]}

        def loss(params, x, y, key):
            mean, logvar = apply(params["model"], x, y, method="encode")
            z = reparameterize(key, mean, logvar)
            mixture = mixture_of(params, prior_module.apply({"params": params["prior"]}))
            kl = (obj.gaussian_log_density(z, mean, logvar)
                  - lp.diagonal_log_density(mixture, z, y))
            logits = apply(params["model"], z, y, method="decode")
            return (reconstruction(logits, x, "bernoulli") + kl).mean()

        return init_both, loss

    vamp = with_prior(lp.PseudoInputs(per_class=50), lambda params, u: lp.vamp_components(
        lambda images, labels: apply(params["model"], images, labels, method="encode"), u))
    mixture = with_prior(lp.GaussianMixturePrior(components=10, latent_dim=config.latent_dim),
                         lambda params, out: out)
    return {"elbo": (init, elbo), f"iwae-k{K}": (init, iwae), f"dreg-k{K}": (init, dreg),
            "vamp-50": vamp, "learned-mixture-10": mixture}


def ladder_losses(config):
    model = hv.create_ladder(config.replace(stochastic_layers=2, upper_latent_dim=8))
    total = sum(model.latent_dims)

    def init(key):
        return hv.init_ladder(model, key)["params"]

    def elbo(params, x, y, key):
        out = model.apply({"params": params}, x, y, jax.random.normal(key, (x.shape[0], total)))
        kl = sum(k.sum(-1) for k in hv.layer_kls(out))
        return (reconstruction(out.logits, x, "bernoulli") + kl).mean()

    def dreg(params, x, y, key):
        noise = jax.random.normal(key, (K, x.shape[0], total))

        def scored(p, z):
            return model.apply({"params": p}, x, y, z, method="score")

        def sample_fn(p):
            return model.join([t.z for t in model.apply({"params": p}, x, y, noise).layers])

        def log_joint_fn(p, z):
            out = scored(p, z)
            return -reconstruction(out.logits, x, "bernoulli") + hv.log_p(out, y)

        weights = obj.dreg_log_weights(params, (sample_fn, lambda p, z: hv.log_q(scored(p, z)),
                                                log_joint_fn))
        return -obj.dreg_surrogate(*weights).mean()

    return {"ladder-2": (init, elbo), f"ladder-2-dreg-k{K}": (init, dreg)}


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
    for name, (init_fn, loss_fn) in {**cvae_losses(config), **ladder_losses(config)}.items():
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
