"""`train_and_evaluate`: the epoch loop. It owns no maths, logging or saving.

It builds the model, optimizer and jitted pieces from the config, resumes from the latest
checkpoint unless told not to, puts the dataset on the device, and then alternates fused chunks
of train steps with an evaluation at each epoch end, announcing every event to the callbacks.
Chunks end on multiples of `steps_per_call` within an epoch, so a run stopped and resumed runs
exactly the same device programs as one that was not, and ends with bit-identical parameters.
SIGINT/SIGTERM finish the current chunk, then the callbacks save and the loop returns.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from cvae.callbacks import Callback, CallbackList, Run
from cvae.checkpoint import (create_manager, load_checkpoint, read_config, restore_newest_readable,
                             restore_state)
from cvae.config import RESUMABLE_CHANGES, Config, ConfigError
from cvae.data import Dataset
from cvae.model import create_model
from cvae.optim import create_optimizer
from cvae.parallel import create_mesh, replicate
from cvae.train import (create_eval_step, create_train_chunk, create_train_step, epoch_permutation,
                        evaluate, run_key)

log = logging.getLogger(__name__)


class ResumeError(RuntimeError):
    """The checkpoint directory holds a run that the requested config cannot continue."""


def planned_steps(config: Config, num_examples: int) -> tuple[int, int]:
    """(steps per epoch, total steps). The LR schedule spans all epochs; max_steps only cuts."""
    steps_per_epoch = num_examples // config.batch_size
    if steps_per_epoch == 0:
        raise ConfigError(f"batch_size={config.batch_size}: larger than the {num_examples} "
                          f"training examples (lower --batch-size or raise --train-limit)")
    total = config.epochs * steps_per_epoch
    return steps_per_epoch, min(total, config.max_steps) if config.max_steps else total


def training_arrays(data: Dataset, config: Config) -> tuple[jax.Array, jax.Array]:
    """The (optionally limited) training set on the device: uint8[N, 784], int32[N]."""
    limit = config.train_limit or len(data.train_images)
    images = data.train_images[:limit].reshape(-1, 28 * 28)
    return jnp.asarray(images), jnp.asarray(data.train_labels[:limit], jnp.int32)


def resume_state(checkpoint_dir: Path, state, config: Config):
    """The newest readable checkpoint's state if its config agrees, else `state` (fresh start)."""
    resumable = tuple(f for f in config.to_dict() if f not in RESUMABLE_CHANGES)

    def restore(step: int):
        differences = read_config(manager, step).diff(config, resumable)
        if differences:
            listed = ", ".join(f"{k}: checkpoint {a!r} vs requested {b!r}"
                               for k, (a, b) in differences.items())
            raise ResumeError(f"{checkpoint_dir} holds a run with a different config ({listed}); "
                              f"pass --fresh to start over there, or use another --checkpoint-dir")
        return restore_state(manager, step, state)[0]

    manager = create_manager(checkpoint_dir, read_only=True)
    try:
        found = restore_newest_readable(manager, restore)
        unreadable = [s for s in manager.all_steps() if found is None or s > found[0]]
    finally:
        manager.close()
    for step in unreadable:  # moved aside, not deleted: training will write these steps again
        target = checkpoint_dir / f"unreadable-{step}-{time.strftime('%Y%m%d-%H%M%S')}"
        (checkpoint_dir / str(step)).rename(target)
        log.warning("moved unreadable checkpoint step %d to %s", step, target)
    return state if found is None else found[1]


def set_aside_previous_run(checkpoint_dir: Path) -> Path | None:
    """`--fresh` keeps the old run: its steps, logs and grids move to `replaced-<time>/`."""
    if not checkpoint_dir.is_dir():
        return None
    previous = [p for p in checkpoint_dir.iterdir()
                if p.name.isdigit() or p.name in ("metrics.jsonl", "samples", "samples_latest.png")]
    if not previous:
        return None
    archive = checkpoint_dir / time.strftime("replaced-%Y%m%d-%H%M%S")
    archive.mkdir()
    for path in previous:
        path.rename(archive / path.name)
    log.warning("--fresh: moved the previous run in %s to %s", checkpoint_dir, archive)
    return archive


def initialise_from(state, source_dir: str | Path):
    """Copy parameters (and BatchNorm statistics) from another run, e.g. to fine-tune a part."""
    source = load_checkpoint(source_dir)
    params = source.state.params
    return state.replace(params=params, batch_stats=source.state.batch_stats,
                         ema_params=params if state.ema_params is not None else None,
                         opt_state=state.tx.init(params))


@contextlib.contextmanager
def stop_on_signals(run: Run):
    """SIGINT/SIGTERM ask the loop to stop after the current chunk instead of killing it."""
    def handler(signum, _frame):
        run.request_stop(f"interrupted by {signal.Signals(signum).name}")

    installed = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            installed[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread: leave signals alone
        pass
    try:
        yield
    finally:
        for sig, previous in installed.items():
            signal.signal(sig, previous)


def train_and_evaluate(config: Config, data: Dataset, checkpoint_dir: str | Path,
                       callbacks: list[Callback] = (), fresh: bool = False,
                       init_from: str | Path | None = None,
                       devices: list[jax.Device] | None = None) -> Run:
    """Train `config` on `data`, evaluating and checkpointing each epoch. Returns the `Run`.

    Data-parallel over `devices` (default: all local devices).
    """
    config.validate()
    checkpoint_dir = Path(checkpoint_dir)
    mesh = create_mesh(devices)
    images, labels = training_arrays(data, config)
    steps_per_epoch, total_steps = planned_steps(config, images.shape[0])
    model = create_model(config)
    optimizer, learning_rate_fn = create_optimizer(config, config.epochs * steps_per_epoch)
    key = run_key(config.seed)
    state, train_step = create_train_step(key, model, optimizer, config, learning_rate_fn, mesh)
    if init_from is not None:
        state = initialise_from(state, init_from)
    if fresh:
        set_aside_previous_run(checkpoint_dir)
    else:
        state = resume_state(checkpoint_dir, state, config)
    state, images, labels = replicate((state, images, labels), mesh)

    train_chunk = create_train_chunk(train_step, config.batch_size)
    eval_step = create_eval_step(model, config)
    test_images, test_labels = replicate(
        (jnp.asarray(data.test_images.reshape(-1, 28 * 28)), jnp.asarray(data.test_labels,
                                                                        jnp.int32)), mesh)

    step = int(state.step)
    run = Run(config, checkpoint_dir, steps_per_epoch, total_steps, state=state, step=step,
              start_step=step)
    events = CallbackList(callbacks)
    with stop_on_signals(run):
        events.emit("fit_start", run)
        while step < total_steps and not run.stopping:
            run.epoch, position = divmod(step, steps_per_epoch)
            order = replicate(epoch_permutation(key, run.epoch, images.shape[0]), mesh)
            events.emit("epoch_start", run)
            while position < steps_per_epoch and step < total_steps and not run.stopping:
                num_steps = min(config.steps_per_call - position % config.steps_per_call,
                                steps_per_epoch - position, total_steps - step)
                state, metrics = train_chunk(state, images, labels, order, position, key,
                                             num_steps=num_steps)
                step, position = step + num_steps, position + num_steps
                run.state, run.step = state, step
                events.emit("step_end", run, jax.device_get(metrics))
            if run.extras.get("nan") or position < steps_per_epoch and step < total_steps:
                break  # stopped mid-epoch: no evaluation of a half-trained epoch
            test_metrics = evaluate(eval_step, state.eval_variables(), test_images, test_labels,
                                    key, config.eval_batch_size)
            events.emit("eval_end", run, test_metrics)
            events.emit("epoch_end", run, test_metrics)
        events.emit("fit_end", run)
    return run
