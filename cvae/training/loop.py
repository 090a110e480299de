"""`train_and_evaluate`: the epoch loop. It owns no maths, logging or saving.

It builds the model, optimizer and jitted pieces from the config, resumes from the latest
checkpoint unless told not to, puts the training and validation examples on the device, and
then alternates fused chunks of train steps with an evaluation on the validation examples at
each epoch end (every `eval_every` epochs), announcing every event to the callbacks. With a
mixture prior, the prior is fitted to the codes of the training examples before each
evaluation. The test set is never read here.
Chunks end on multiples of `steps_per_call` within an epoch, so a run stopped and resumed runs
exactly the same device programs as one that was not, and ends with bit-identical parameters.
SIGINT/SIGTERM stop before the next chunk (on every process at once), then the callbacks save
and the loop returns. Run as one of N processes, the loop is the same: the mesh spans all
processes' devices, and only process 0 moves folders (`--fresh`, unreadable steps).
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import jax
import jax.numpy as jnp

from cvae.model import prior as prior_lib
from cvae.training import few_labels
from cvae.training.callbacks import Callback, CallbackList, Run
from cvae.training.checkpoints import keep_schedule_span, schedule_span, start_state
from cvae.config import NUM_CLASSES, Config
from cvae.data.load import Dataset
from cvae.training.processes import any_process
from cvae.errors import ConfigError
from cvae.evaluation.run import create_eval_step, evaluate
from cvae.model.networks import CVAE, create_model
from cvae.training.optimizer import create_optimizer
from cvae.training.devices import create_mesh, replicate
from cvae.data.splits import split_training_set
from cvae.training.step import (create_train_chunk, create_train_step, epoch_permutation,
                                labelled_permutation, prior_fit_key, run_key)


def planned_steps(config: Config, num_examples: int) -> tuple[int, int]:
    """(steps per epoch, total steps). The LR schedule spans all epochs; max_steps only cuts.

    With `--labels N` an epoch is one pass over the unlabelled images, `batch_size -
    labelled_per_batch` a step (`num_examples` counts the unlabelled ones then)."""
    per_step = config.batch_size
    if config.labelled_count is not None:
        per_step -= config.labelled_per_batch
    steps_per_epoch = num_examples // per_step
    if steps_per_epoch == 0:
        raise ConfigError(f"batch_size={config.batch_size}: larger than the {num_examples} "
                          f"training examples (lower --batch-size or raise --train-limit)")
    total = config.epochs * steps_per_epoch
    return steps_per_epoch, min(total, config.max_steps) if config.max_steps else total


def device_arrays(images, labels) -> tuple[jax.Array, jax.Array]:
    """uint8[N, 28, 28], int[N] -> on the device as uint8[N, 784], int32[N]."""
    return jnp.asarray(images.reshape(-1, 28 * 28)), jnp.asarray(labels, jnp.int32)


def create_prior_fit(model, config: Config, train_labels, labelled=None):
    """`fit(state, images, labels, key) -> state` with its mixture prior refitted, or None when
    the run's prior is the standard one.

    With a labelled set (`--labels N`), the unlabelled images' labels are never read: each is
    given the label q(y|x) reads, the labelled ones keep their own.
    """
    if config.prior != "mixture":
        return None
    fit_fn = prior_lib.create_fit_fn(
        lambda variables, x, y: model.apply(variables, x, y, method=CVAE.encode),
        config.prior_components, config.prior_codes)
    if labelled is not None:
        return create_read_prior_fit(model, fit_fn, labelled)
    table = prior_lib.class_index_table(train_labels, NUM_CLASSES)

    def fit(state, images, labels, key):
        mixture = fit_fn(state.eval_variables(), images, labels, *table, key)
        return state.replace(prior={prior_lib.VARIABLE: mixture})

    return fit


def create_read_prior_fit(model, fit_fn, labelled):
    classify = few_labels.create_classify_fn(model)
    positions, known = jnp.asarray(labelled["positions"]), jnp.asarray(labelled["labels"])

    def fit(state, images, labels, key):
        variables = state.eval_variables()
        read = classify(variables, images).astype(jnp.int32).at[positions].set(known)
        # Widths rounded up, so the fit compiles for a few table shapes, not one per epoch.
        table = prior_lib.class_index_table(jax.device_get(read), NUM_CLASSES,
                                            width_multiple=1024)
        mixture = fit_fn(variables, images, read, *table, key)
        return state.replace(prior={prior_lib.VARIABLE: mixture})

    return fit


def create_validation(model, config: Config, split, mesh, labelled: dict | None):
    """`validate(state, key) -> metrics` on the validation split: the training objective's
    terms (`cvae.evaluation.run`), and with a labelled set q(y|x)'s error ("classifier_error")."""
    eval_step = create_eval_step(model, config)
    images, labels = replicate(device_arrays(split.validation_images, split.validation_labels),
                               mesh)
    classifier_error = None if labelled is None else few_labels.create_error_fn(model)

    def validate(state, key) -> dict[str, float]:
        metrics = evaluate(eval_step, state.eval_variables(), images, labels, key,
                           config.eval_batch_size, config)
        if classifier_error is not None:
            metrics["classifier_error"] = classifier_error(state.eval_variables(), images, labels)
        return metrics

    return validate


def adopt_labelled_set(state, labelled: dict, checkpoint_dir: Path):
    """`state` carrying the run's labelled set; a resumed state must carry the same one."""
    if int(state.step) > 0:
        few_labels.check_labelled_set(jax.device_get(state.labelled), labelled, checkpoint_dir)
    return state.replace(labelled={name: jnp.asarray(labelled[name])
                                   for name in ("indices", "labels")})


def create_epoch_order(key, num_examples: int, labelled: dict | None, mesh):
    """`order(epoch)`: the rows of that epoch's batches, on the device. Every label: one
    permutation of the training part. `--labels N`: (labelled rows, unlabelled rows), each
    permuted (`cvae.training.few_labels.create_semi_train_chunk` reads them)."""
    if labelled is None:
        return lambda epoch: replicate(epoch_permutation(key, epoch, num_examples), mesh)
    labelled_rows = jnp.asarray(labelled["positions"])
    unlabelled_rows = jnp.asarray(
        few_labels.unlabelled_positions(num_examples, labelled["positions"]))

    def order(epoch):
        return replicate(
            (labelled_rows[labelled_permutation(key, epoch, labelled_rows.shape[0])],
             unlabelled_rows[epoch_permutation(key, epoch, unlabelled_rows.shape[0])]), mesh)

    return order


class Interrupts:
    """SIGINT/SIGTERM noted by the handler and acted on between chunks, by all processes at once.

    A signal reaches one process at one moment; stopping there alone would leave the others
    waiting in a collective. So the handler only records it, and before each chunk every
    process asks whether any of them was interrupted (`distributed.any_process`).
    """

    def __init__(self):
        self.reason: str | None = None

    def handler(self, signum, _frame) -> None:
        self.reason = self.reason or f"interrupted by {signal.Signals(signum).name}"

    def agreed_stop(self, run: Run) -> bool:
        """True on every process, with the stop requested, when any process was interrupted."""
        if any_process(self.reason is not None):
            run.request_stop(self.reason or "another process was interrupted")
        return run.stopping


@contextlib.contextmanager
def stop_on_signals(interrupts: Interrupts):
    """SIGINT/SIGTERM ask the loop to stop before the next chunk instead of killing it."""
    handler = interrupts.handler
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

    Only `data`'s training file is read: it is split into training and validation examples
    (`cvae.data.splits`), and every per-epoch figure, the best checkpoint, early stopping and the
    NaN guard's evaluation check come from the validation part. The test set is left to
    `cvae eval`. Data-parallel over `devices` (default: every device of every process, see
    `cvae.training.processes`).
    """
    config.validate()
    checkpoint_dir = Path(checkpoint_dir)
    mesh = create_mesh(devices)
    split = split_training_set(data.train_images, data.train_labels, config)
    images, labels = device_arrays(split.train_images, split.train_labels)
    labelled = (None if config.labelled_count is None
                else few_labels.choose_labelled_set(split, config))
    if not fresh:
        config = keep_schedule_span(checkpoint_dir, config)
    steps_per_epoch, total_steps = planned_steps(
        config, images.shape[0] - (0 if labelled is None else len(labelled["positions"])))
    model = create_model(config)
    optimizer, learning_rate_fn = create_optimizer(config,
                                                   schedule_span(config) * steps_per_epoch)
    key = run_key(config.seed)
    share = None if labelled is None else few_labels.labelled_share(config, images.shape[0])
    state, train_step = create_train_step(key, model, optimizer, config, learning_rate_fn, mesh,
                                          share)
    state = start_state(state, config, checkpoint_dir, fresh=fresh, init_from=init_from)
    if labelled is not None:
        state = adopt_labelled_set(state, labelled, checkpoint_dir)
    state, images, labels = replicate((state, images, labels), mesh)

    train_chunk = (create_train_chunk(train_step, config.batch_size, mesh) if labelled is None
                   else few_labels.create_semi_train_chunk(train_step, config))
    epoch_order = create_epoch_order(key, images.shape[0], labelled, mesh)
    validate = create_validation(model, config, split, mesh, labelled)
    fit_prior = create_prior_fit(model, config, split.train_labels, labelled)

    step = int(state.step)
    run = Run(config, checkpoint_dir, steps_per_epoch, total_steps, state=state, step=step,
              start_step=step)
    events = CallbackList(callbacks)
    interrupts = Interrupts()
    with stop_on_signals(interrupts):
        events.emit("fit_start", run)
        while step < total_steps and not run.stopping:
            run.epoch, position = divmod(step, steps_per_epoch)
            order = epoch_order(run.epoch)
            events.emit("epoch_start", run)
            while (position < steps_per_epoch and step < total_steps
                   and not interrupts.agreed_stop(run)):
                num_steps = min(config.steps_per_call - position % config.steps_per_call,
                                steps_per_epoch - position, total_steps - step)
                state, metrics = train_chunk(state, images, labels, order, position, key,
                                             num_steps=num_steps)
                step, position = step + num_steps, position + num_steps
                run.state, run.step = state, step
                events.emit("step_end", run, jax.device_get(metrics))
            if run.non_finite or position < steps_per_epoch and step < total_steps:
                break  # stopped mid-epoch: no evaluation of a half-trained epoch
            if (run.epoch + 1) % config.eval_every and step < total_steps and not run.stopping:
                continue  # evaluated, logged and saved every `eval_every` epochs and at the end
            if fit_prior is not None:
                state = run.state = fit_prior(state, images, labels,
                                              prior_fit_key(key, run.epoch))
            metrics = validate(state, key)
            events.emit("eval_end", run, metrics)
            if run.non_finite:
                break  # a non-finite validation figure: nothing of this epoch is saved
            events.emit("epoch_end", run, metrics)
        events.emit("fit_end", run)
    return run
