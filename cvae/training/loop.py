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
and the loop returns; one noted during `cvae train`'s start-up stops it before its first
chunk. Run as one of N processes, the loop is the same: the mesh spans all processes' devices,
and only process 0 moves folders (`--fresh`, unreadable steps).
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import jax
import jax.numpy as jnp

from cvae.config.sections import Config
from cvae.data.load import Dataset
from cvae.data.splits import split_training_set
from cvae.errors import ConfigError
from cvae.model import learned_prior
from cvae.model import prior as prior_lib
from cvae.model.registry import create_model
from cvae.training.callbacks import Callback, CallbackList, Run
from cvae.training.devices import create_mesh, replicate
from cvae.training.optimizer import create_optimizer
from cvae.training.processes import any_process
from cvae.training.start import keep_schedule_span, schedule_span, start_state
from cvae.training.step import create_train_step, device_arrays, prior_fit_key, run_key
from cvae.training import signals as startup_signals
from cvae.training.supervision import Supervision, create_supervision
from cvae.data.specs import check_config
from cvae.training.validation import create_validation


def planned_steps(config: Config, epoch_rows: int, rows_per_step: int) -> tuple[int, int]:
    """(steps per epoch, total steps) for epochs of `epoch_rows` rows, `rows_per_step` a step
    (`cvae.training.supervision`). The LR schedule spans all epochs; max_steps only cuts."""
    steps_per_epoch = epoch_rows // rows_per_step
    if steps_per_epoch == 0:
        raise ConfigError(f"batch_size={config.run.batch_size}: larger than the {epoch_rows} "
                          f"training examples (lower --batch-size or raise --train-limit)")
    total = config.run.epochs * steps_per_epoch
    return steps_per_epoch, min(total, config.run.max_steps) if config.run.max_steps else total


def create_prior_fit(model, config: Config, supervision: Supervision):
    """`fit(state, images, labels, key) -> state` with its mixture prior refitted, under the
    labels the `supervision` gives; None when the run's prior is the standard one."""
    prior = config.prior.component
    if prior.learned:
        collectors = {}  # sharding -> jitted collection, made once per mesh

        def write(state, images, labels, key):  # learnt, not fitted: written as it stands
            # Jitted onto the parameters' replicated sharding: the collection's constants (a
            # VampPrior's equal weights) would otherwise be host-local arrays, which a
            # multi-process checkpoint cannot save.
            sharding = jax.tree.leaves(state.params)[0].sharding
            if sharding not in collectors:
                collectors[sharding] = jax.jit(
                    lambda params: {prior_lib.VARIABLE: learned_prior.as_mixture(model.apply(
                        {"params": params}, method="prior_mixture"))}, out_shardings=sharding)
            prior = collectors[sharding](state.eval_variables()["params"])
            # Copies: a learned mixture's means are its parameters' own buffers (jit may
            # forward them), and the state is donated to the step, so each must be its own.
            return state.replace(prior=jax.tree.map(jnp.copy, prior))
        return write
    fit_fn = prior.fit(lambda variables, x, y: model.apply(variables, x, y, method="encode"),
                       options=config.prior.options,
                       binarized=not config.likelihood.component.scores_levels)
    if fit_fn is None:
        return None
    prior_labels = supervision.create_prior_labels(model)

    def fit(state, images, labels, key):
        variables = state.eval_variables()
        mixture = fit_fn(variables, images, *prior_labels(variables, images, labels), key)
        return state.replace(prior={prior_lib.VARIABLE: mixture})

    return fit


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
    """SIGINT/SIGTERM ask the loop to stop before the next chunk instead of killing it; one
    that came during the start-up of `cvae train` (`cvae.training.signals`) is taken over."""
    handler = interrupts.handler
    installed = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            installed[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread: leave signals alone
        pass
    startup_signals.note_only()  # once the loop is over, a signal is noted, not a start-up stop
    if (noted := startup_signals.take_pending()) is not None:
        interrupts.reason = (f"interrupted by {signal.Signals(noted).name} during start-up, "
                             f"before any step")
    try:
        yield
    finally:
        for sig, previous in installed.items():
            signal.signal(sig, previous)


def train_and_evaluate(config: Config, data: Dataset, checkpoint_dir: str | Path, *,
                       callbacks: list[Callback] = (), fresh: bool = False,
                       init_from: str | Path | None = None,
                       devices: list[jax.Device] | None = None) -> Run:
    """Train `config` on `data`, evaluating and saving every `eval_every` epochs; the `Run`.

    Only `data`'s training file is read: it is split into training and validation examples
    (`cvae.data.splits`), and every per-epoch figure, the best checkpoint, early stopping and the
    NaN guard's evaluation check come from the validation part. The test set is left to
    `cvae eval`. Data-parallel over `devices` (default: every device of every process, see
    `cvae.training.processes`).
    """
    config.validate()
    check_config(config)
    checkpoint_dir = Path(checkpoint_dir)
    mesh = create_mesh(devices)
    split = split_training_set(data.train_images, data.train_labels, config)
    images, labels = device_arrays(split.train_images, split.train_labels)
    supervision = create_supervision(config, split)
    if not fresh:
        config = keep_schedule_span(checkpoint_dir, config)
    steps_per_epoch, total_steps = planned_steps(config, supervision.epoch_rows,
                                                 supervision.rows_per_step)
    model = create_model(config)
    optimizer, learning_rate_fn = create_optimizer(config,
                                                   schedule_span(config) * steps_per_epoch)
    key = run_key(config.run.seed)
    state, train_step = create_train_step(model, optimizer, config, key=key,
                                          supervision=supervision,
                                          learning_rate_fn=learning_rate_fn, mesh=mesh)
    state = start_state(state, config, checkpoint_dir, fresh=fresh, init_from=init_from)
    state = supervision.adopt(state, checkpoint_dir)
    state, images, labels = replicate((state, images, labels), mesh)

    train_chunk = supervision.create_train_chunk(train_step, mesh)
    epoch_order = supervision.create_epoch_order(key, mesh)
    validate = create_validation(model, config, split=split, mesh=mesh, supervision=supervision)
    fit_prior = create_prior_fit(model, config, supervision)

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
                num_steps = min(config.run.steps_per_call - position % config.run.steps_per_call,
                                steps_per_epoch - position, total_steps - step)
                state, metrics = train_chunk(state, images, labels, order, position, key,
                                             num_steps=num_steps)
                step, position = step + num_steps, position + num_steps
                run.state, run.step = state, step
                events.emit("step_end", run, metrics)  # host arrays already
            if run.non_finite or position < steps_per_epoch and step < total_steps:
                break  # stopped mid-epoch: no evaluation of a half-trained epoch
            if (run.epoch + 1) % config.run.eval_every and step < total_steps and not run.stopping:
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
