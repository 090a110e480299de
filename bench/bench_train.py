"""Training speed: our fused chunk vs the seed loop (and PyTorch), against this machine's floor.

    results = run_all(quick, data_dir, workdir)     # what bench/run.py calls

Measures, for the default model (MLP 784-512-256, latent 16, Bernoulli), in interleaved rounds
(bench/rounds.py: every candidate once per round, ratios are medians of per-round ratios):
- throughput (examples/s, compile excluded) of `create_train_chunk` at batch 16, 128 and 512,
  run in chunks of `steps_per_call` steps as the training loop does;
- baseline (a), the seed document's loop: one jitted step per batch, the batch sliced and
  converted in host NumPy, `jax.random.split` on the host each step, batch 16;
- baseline (b), the same model and loss in PyTorch on the CPU, when torch is importable;
- the floor: float32 matmul GFLOP/s (jnp.dot of 2048x2048 matrices), the model's FLOPs per
  example (2*in*out per Dense layer forward, x3 for forward + backward), the FLOP-bound ideal
  examples/s and the fraction training reaches at each batch.
Then, on their own (absolute figures, no comparison): wall time of one epoch of 60000 at the
default batch size (chunked like the loop, no eval), and time to quality: wall time from a fresh
start until the conditional accuracy of samples (scored by the cached classifier after each
epoch) first reaches 95%.
`--quick` uses the tiny test model, synthetic data and tiny counts (a smoke run, ~30 s).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bench import rounds as rounds_lib
from bench.machine import gemm_call
from cvae.config import presets
from cvae.training.callbacks import Callback
from cvae.data.load import Dataset
from cvae.model import objectives
from cvae.model.registry import create_model
from cvae.training.optimizer import create_optimizer
from cvae.data.synthetic import synthetic_dataset
from cvae.model.binarization import maybe_binarize
from cvae.training.step import (create_train_chunk, create_train_state, create_train_step,
                                epoch_permutation)
from cvae.training.supervision import FullLabels


def forward_flops_per_example(params) -> int:
    """2*in*out per Dense kernel; each of encoder and decoder runs once per training example."""
    kernels = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(params)
               if getattr(path[-1], "key", None) == "kernel" and leaf.ndim == 2]
    return int(sum(2 * k.shape[0] * k.shape[1] for k in kernels))


def _device_data(data: Dataset):
    return (jnp.asarray(data.train_images.reshape(-1, 784)),
            jnp.asarray(data.train_labels, jnp.int32))


def optimizer_update_ms(config, repeats: int = 50) -> float:
    """Time of the optimizer update alone on the model's parameters: the memory-bound floor of
    a step that no loop structure removes."""
    model = create_model(config)
    optimizer, _ = create_optimizer(config, 1000)
    state = create_train_state(model, optimizer, config, key=jax.random.key(0))
    update = jax.jit(optimizer.update)
    grads = jax.tree.map(jnp.ones_like, state.params)
    jax.block_until_ready(update(grads, state.opt_state, state.params))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(update(grads, state.opt_state, state.params))
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def fused_runner(config, data: Dataset, batch_size: int,
                 steps: int) -> tuple[Callable[[], None], int]:
    """`create_train_chunk` for `steps` steps in chunks of config.run.steps_per_call, compiled; and
    the examples one call trains on."""
    config = config.replace(batch_size=batch_size)
    images, labels = _device_data(data)
    steps = max(1, min(steps, images.shape[0] // batch_size))
    model = create_model(config)
    optimizer, _ = create_optimizer(config, 10 * steps)
    key = jax.random.key(config.run.seed)
    state, train_step = create_train_step(model, optimizer, config, key=key,
                                          supervision=FullLabels(config))
    chunk = create_train_chunk(train_step, batch_size, max_steps=config.run.steps_per_call)
    order = epoch_permutation(key, 0, images.shape[0])
    box = {"state": state}

    def run():
        state = box["state"]
        for first in range(0, steps, config.run.steps_per_call):
            state, metrics = chunk(state, images, labels, order, first, key,
                                   num_steps=min(config.run.steps_per_call, steps - first))
        jax.block_until_ready(metrics)
        box["state"] = state

    run()  # compile
    return run, steps * batch_size


def epoch_seconds(config, data: Dataset, repeats: int) -> float:
    """One epoch at config.run.batch_size, chunked exactly like the loop (no evaluation)."""
    run, _ = fused_runner(config, data, config.run.batch_size,
                          data.train_images.shape[0] // config.run.batch_size)
    return statistics.median(rounds_lib.timed(run)() for _ in range(repeats))


def seed_loop_runner(config, data: Dataset, batch_size: int,
                     steps: int) -> tuple[Callable[[], None], int]:
    """Baseline (a): the seed document's loop on the same model and loss, compiled."""
    config = config.replace(batch_size=batch_size)
    model = create_model(config)
    optimizer, _ = create_optimizer(config, 10 * steps)
    state = create_train_state(model, optimizer, config, key=jax.random.key(0))
    host_images = data.train_images.reshape(-1, 784)
    host_labels = data.train_labels.astype(np.int32)

    @jax.jit
    def step(state, images, labels, key):
        z_key, binarize_key = jax.random.split(key)
        x = maybe_binarize(binarize_key, images, config)

        def loss_fn(params):
            noise = objectives.draw_noise(z_key, model, samples=1, batch=x.shape[0])
            rows, _, _ = objectives.row_terms(model, {"params": params}, images=x,
                                              labels=labels, noise=noise, objective="elbo",
                                              kl_weight=config.objective.kl_weight)
            return objectives.batch_loss(rows, objective="elbo",
                                         kl_weight=config.objective.kl_weight,
                                         free_bits=0.0)[0]

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss

    box = {"state": state, "key": jax.random.key(1)}

    def run():
        state, key = box["state"], box["key"]
        order = np.random.default_rng(0).permutation(len(host_images))
        for i in range(steps):
            idx = order[i * batch_size:(i + 1) * batch_size]
            key, sub = jax.random.split(key)
            state, loss = step(state, host_images[idx].astype(np.float32) / 255.0,
                               host_labels[idx], sub)
        jax.block_until_ready(loss)
        box["state"], box["key"] = state, key

    run()
    return run, steps * batch_size


def torch_runner(config, data: Dataset, batch_size: int,
                 steps: int) -> tuple[Callable[[], None], int] | None:
    """Baseline (b): the same MLP CVAE and loss in PyTorch (CPU), warmed; None if torch is
    absent."""
    try:
        import torch
    except ImportError:
        return None
    act = torch.nn.GELU(approximate="tanh")  # flax's gelu is the tanh approximation
    hidden = config.model.options.hidden_sizes
    enc, width = [], 784 + 10
    for h in hidden:
        enc += [torch.nn.Linear(width, h), act]
        width = h
    encoder = torch.nn.Sequential(*enc, torch.nn.Linear(width, 2 * config.model.options.latent_dim))
    widths = tuple(reversed(hidden))
    z_proj = torch.nn.Linear(config.model.options.latent_dim, widths[0])
    y_proj = torch.nn.Linear(10, widths[0], bias=False)
    dec, width = [], widths[0]
    for h in widths[1:]:
        dec += [torch.nn.Linear(width, h), act]
        width = h
    decoder = torch.nn.Sequential(*dec, torch.nn.Linear(width, 784))
    modules = torch.nn.ModuleList([encoder, z_proj, y_proj, decoder])
    opt = torch.optim.Adam(modules.parameters(), lr=config.optimizer.learning_rate)
    images = torch.from_numpy(data.train_images.reshape(-1, 784).astype(np.float32) / 255.0)
    labels = torch.nn.functional.one_hot(torch.from_numpy(data.train_labels.astype(np.int64)),
                                         10).float()

    def run():
        for i in range(steps):
            x = torch.bernoulli(images[i * batch_size:(i + 1) * batch_size])
            y = labels[i * batch_size:(i + 1) * batch_size]
            mean, raw = encoder(torch.cat([x, y], 1)).chunk(2, 1)
            logvar = config.model.options.logvar_bound * torch.tanh(
                raw / config.model.options.logvar_bound)
            z = mean + torch.exp(0.5 * logvar) * torch.randn_like(mean)
            logits = decoder(act(z_proj(z) + y_proj(y)))
            rec = torch.nn.functional.binary_cross_entropy_with_logits(
                logits, x, reduction="none").sum(1)
            kl = 0.5 * (logvar.exp() + mean**2 - 1 - logvar).sum(1)
            loss = (rec + kl).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    steps = max(1, min(steps, len(images) // batch_size))
    run()
    return run, steps * batch_size


class _QualityClock(Callback):
    """Scores samples after each epoch; stops once conditional accuracy >= target.

    Scoring time is subtracted, so the clock counts only training (with its evaluation).
    """

    def __init__(self, classifier, target: float, samples_per_digit: int):
        self.classifier, self.target, self.n = classifier, target, samples_per_digit
        self.start = self.scoring = 0.0
        self.history: list[tuple[int, float, float]] = []  # (epoch, seconds, accuracy)
        self.reached: float | None = None

    def on_fit_start(self, run):
        self.start = time.perf_counter()

    def on_epoch_end(self, run, metrics):
        from cvae.sampling.sampler import create_sampler

        begin = time.perf_counter()
        sampler = create_sampler(create_model(run.config), run.config,
                                 run.state.eval_variables(), block_rows=500)
        samples = sampler.sample_images(None, self.n, seed=0)
        labels = np.repeat(np.arange(10), self.n)
        logits, _ = self.classifier.logits_and_features(samples)
        accuracy = float(np.mean(logits.argmax(1) == labels))
        self.scoring += time.perf_counter() - begin
        elapsed = time.perf_counter() - self.start - self.scoring
        self.history.append((run.epoch + 1, elapsed, accuracy))
        if accuracy >= self.target and self.reached is None:
            self.reached = elapsed
            run.request_stop(f"sample accuracy {accuracy:.3f} >= {self.target}")


def time_to_quality(config, data: Dataset, classifier, checkpoint_dir, max_epochs: int,
                    target: float = 0.95, samples_per_digit: int = 100) -> dict:
    from cvae.training.callbacks import Checkpointer
    from cvae.training.loop import planned_steps, train_and_evaluate
    from cvae.data.splits import training_size

    steps_per_epoch, _ = planned_steps(config, training_size(len(data.train_images), config),
                                       config.run.batch_size)
    # The schedule still spans config.run.epochs: the run is the default run, cut at max_epochs,
    # evaluated every epoch so that the clock reads each one.
    config = config.replace(max_steps=max_epochs * steps_per_epoch, eval_every=1)
    clock = _QualityClock(classifier, target, samples_per_digit)
    train_and_evaluate(config, data, checkpoint_dir, callbacks=[clock, Checkpointer(1)], fresh=True)
    return {"target": target, "seconds": clock.reached, "max_epochs": max_epochs,
            "history": clock.history}


BATCHES = (16, 128, 512)
PAUSE_S = 0.2  # between candidates, so the previous one's thread pools (XLA's, torch's) go idle


def compare_loops(config, data: Dataset, steps: int, seed_steps: int, rounds: int,
                  matmul_size: int, train_flops_per_example: int, log=print) -> dict:
    """Our fused chunk at each batch, the seed loop, PyTorch and the matmul floor, timed in
    interleaved rounds; rates are medians over rounds and ratios medians of per-round ratios."""
    runners = {f"fused {b}": fused_runner(config, data, b, steps) for b in BATCHES}
    runners["seed loop 16"] = seed_loop_runner(config, data, 16, seed_steps)
    pytorch = torch_runner(config, data, 128, steps)
    if pytorch is not None:
        runners["torch 128"] = pytorch
    runners["matmul"] = gemm_call(matmul_size)
    times = rounds_lib.interleaved({name: rounds_lib.timed(run)
                                    for name, (run, _) in runners.items()}, rounds, PAUSE_S)
    rates = {name: [runners[name][1] / t for t in ts] for name, ts in times.items()}
    ideal = [r / train_flops_per_example for r in rates["matmul"]]  # examples/s, per round
    ratio = rounds_lib.median_ratio
    results = {"rounds": rounds, "matmul_gflops": statistics.median(rates["matmul"]) / 1e9,
               "ideal_examples_per_s": statistics.median(ideal),
               "fused": {b: statistics.median(rates[f"fused {b}"]) for b in BATCHES},
               "seed_loop_16": statistics.median(rates["seed loop 16"]),
               "torch_128": statistics.median(rates["torch 128"]) if pytorch else None,
               "ratios": {b: {"vs_seed_loop_16": ratio(rates[f"fused {b}"], rates["seed loop 16"]),
                              "vs_torch_128": (ratio(rates[f"fused {b}"], rates["torch 128"])
                                               if pytorch else None),
                              "of_ideal": ratio(rates[f"fused {b}"], ideal)} for b in BATCHES}}
    for name, values in rates.items():
        log(f"{name}: {', '.join(f'{v:,.0f}' for v in values)} per s over {rounds} rounds")
    return results


def run_all(quick: bool, data_dir: str, workdir, log=print) -> dict:
    """Every training figure; `workdir` receives the time-to-quality run's checkpoints."""
    from cvae.data.load import load_dataset
    from cvae.evaluation.fidelity import load_or_train_classifier

    if quick:
        config = presets.test().replace(steps_per_call=10)
        data = synthetic_dataset(2048, 256)
        steps, rounds, seed_steps, matmul_size = 20, 2, 20, 512
        classifier = load_or_train_classifier(data, None, epochs=1, log=log)
        max_epochs = 1
    else:
        config = presets.default()
        data = load_dataset(data_dir, config.data.dataset, config.data.source)
        steps, rounds, seed_steps, matmul_size = 400, 5, 400, 2048
        classifier = load_or_train_classifier(data, f"{data_dir}/classifier", log=log)
        max_epochs = config.run.epochs  # the whole default run at most; it stops at the target
    results = {"quick": quick, "device": str(jax.devices()[0].platform),
               "hidden_sizes": list(config.model.options.hidden_sizes),
               "latent_dim": config.model.options.latent_dim,
               "matmul_size": matmul_size}
    params = create_train_state(create_model(config), optax.adam(1e-3), config,
                                key=jax.random.key(0)).params
    results["forward_flops_per_example"] = forward_flops_per_example(params)
    results["train_flops_per_example"] = 3 * results["forward_flops_per_example"]
    results["param_count"] = int(sum(p.size for p in jax.tree.leaves(params)))
    results["optimizer_update_ms"] = optimizer_update_ms(config, 5 if quick else 50)
    results.update(compare_loops(config, data, steps, seed_steps, rounds, matmul_size,
                                 results["train_flops_per_example"], log))
    results["epoch_seconds"] = epoch_seconds(config, data, 1 if quick else 3)
    log(f"epoch at batch {config.run.batch_size}: {results['epoch_seconds']:.1f} s")
    results["time_to_quality"] = time_to_quality(config, data, classifier, workdir, max_epochs)
    log(f"time to quality: {results['time_to_quality']}")
    results["batch_size"] = config.run.batch_size
    results["train_examples"] = int(len(data.train_images))
    return results
