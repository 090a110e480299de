"""Events of the training loop and the built-in callbacks that listen to them.

Synopsis:

    class PrintKL(Callback):
        def on_eval_end(self, run, metrics):
            print(run.step, metrics["kl"])

    train_and_evaluate(config, data, "checkpoints", callbacks=[*default_callbacks(...), PrintKL()])

A callback sees the loop through `run` (a `Run`: config, state, step, epoch, checkpoint dir) and
may ask it to stop with `run.request_stop(reason)`. Events, in order: fit_start, then per epoch
epoch_start, step_end (once per fused chunk, with the chunk's stacked metrics), eval_end,
epoch_end; finally fit_end (also after a stop). The loop owns no logging, saving or plotting:
all of that lives here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys
import time
from errno import ENOSPC
from pathlib import Path
from typing import Any, Callable

import numpy as np
from tqdm.auto import tqdm

from cvae.model.store import EVAL_SPLIT, PARTIAL_STEP_SUFFIX
from cvae.training.checkpoints import create_manager, save_checkpoint
from cvae.training import processes
from cvae.training.processes import local_copy
from cvae.training.record import create_record, now, write_step_files
from cvae.errors import CheckpointError
from cvae.sampling.grid import make_grid, save_png
from cvae.model.registry import create_model
from cvae.sampling.sampler import create_sampler
from cvae.data.specs import spec_of


@dataclasses.dataclass
class Run:
    """What callbacks may read (and `request_stop`) while the loop runs."""

    config: Any
    checkpoint_dir: Path
    steps_per_epoch: int
    total_steps: int
    state: Any = None
    step: int = 0
    start_step: int = 0  # where this invocation began (> 0 when resumed)
    epoch: int = 0
    stop_reason: str | None = None
    exit_code: int = 0
    # Set by NanGuard when a step produced a non-finite value: the loop then skips the epoch's
    # evaluation and the Checkpointer saves nothing after it.
    non_finite: bool = False

    def request_stop(self, reason: str, exit_code: int = 0) -> None:
        if self.stop_reason is None:
            self.stop_reason, self.exit_code = reason, exit_code

    @property
    def stopping(self) -> bool:
        return self.stop_reason is not None


class Callback:
    """Override the events you need; each gets the `Run` first."""

    def on_fit_start(self, run: Run) -> None: ...
    def on_epoch_start(self, run: Run) -> None: ...
    def on_step_end(self, run: Run, metrics: dict[str, np.ndarray]) -> None: ...
    def on_eval_end(self, run: Run, metrics: dict[str, float]) -> None: ...
    def on_epoch_end(self, run: Run, metrics: dict[str, float]) -> None: ...
    def on_fit_end(self, run: Run) -> None: ...


class CallbackList:
    """Calls each callback in order; the loop talks only to this."""

    def __init__(self, callbacks: list[Callback]):
        self.callbacks = list(callbacks)

    def emit(self, event: str, run: Run, *args) -> None:
        for callback in self.callbacks:
            getattr(callback, f"on_{event}")(run, *args)


class NanGuard(Callback):
    """Stops at the first non-finite loss term of a train step or of the validation figures,
    naming the step and the term; nothing of that epoch is saved."""

    TERMS = ("loss", "reconstruction", "kl", "grad_norm")

    def stop(self, run, what: str) -> None:
        run.non_finite = True
        run.request_stop(f"{what}; the last good checkpoint is kept in {run.checkpoint_dir}",
                         exit_code=3)

    def on_step_end(self, run, metrics):
        first_step = run.step - len(metrics["loss"])
        for term in self.TERMS:
            values = np.asarray(metrics.get(term, []))
            bad = np.flatnonzero(~np.isfinite(values))
            if bad.size:
                self.stop(run, f"non-finite {term} ({values[bad[0]]}) at step "
                               f"{first_step + int(bad[0]) + 1}")
                return

    def on_eval_end(self, run, metrics):
        for term in self.TERMS:
            if term in metrics and not math.isfinite(metrics[term]):
                self.stop(run, f"non-finite {EVAL_SPLIT} {term} ({metrics[term]}) after step "
                               f"{run.step}")
                return


class ProgressBar(Callback):
    """A tqdm bar over all steps with the live loss."""

    def __init__(self, disable: bool | None = None):
        self.disable = disable
        self.bar = None

    def on_fit_start(self, run):
        self.bar = tqdm(total=run.total_steps, initial=run.step, unit="step",
                        dynamic_ncols=True, disable=self.disable, desc="train")

    def on_epoch_start(self, run):
        self.bar.set_description(f"epoch {run.epoch + 1}")

    def on_step_end(self, run, metrics):
        self.bar.update(len(metrics["loss"]))
        self.bar.set_postfix(loss=f"{float(np.mean(metrics['loss'])):.2f}",
                             kl=f"{float(np.mean(metrics['kl'])):.2f}")

    def on_eval_end(self, run, metrics):
        self.bar.write(f"epoch {run.epoch + 1} step {run.step}: validation loss "
                       f"{metrics['loss']:.2f} "
                       f"(reconstruction {metrics['reconstruction']:.2f}, KL {metrics['kl']:.2f}; "
                       f"-ELBO {metrics['neg_elbo']:.2f} nats)")

    def on_fit_end(self, run):
        if self.bar is not None:
            self.bar.close()


class MetricsLogger(Callback):
    """Appends one JSON line per evaluation to `metrics.jsonl`: train means, validation metrics,
    timing, each over every epoch since the previous evaluation (`eval_every` of them).

    Train means are weighted by step count; with equal batches that is the exact example mean.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.sums: dict[str, float] = {}
        self.count = 0
        self.started = 0.0
        self.evaluated = True  # the epochs since the last record are what the next one covers

    def on_epoch_start(self, run):
        if self.evaluated:
            self.sums, self.count, self.started = {}, 0, self.clock()
            self.evaluated = False

    def on_step_end(self, run, metrics):
        for name, values in metrics.items():
            self.sums[name] = self.sums.get(name, 0.0) + float(np.sum(values))
        self.count += len(metrics["loss"])

    def on_epoch_end(self, run, metrics):
        record = {"epoch": run.epoch + 1, "step": run.step,
                  "seconds": round(self.clock() - self.started, 3)}
        record.update({f"train_{k}": v / self.count for k, v in self.sums.items() if self.count})
        record.update(prefixed(metrics))
        if self.count and record["seconds"] > 0:
            record["examples_per_second"] = round(
                self.count * run.config.run.batch_size / record["seconds"], 1)
        append_jsonl(Path(run.checkpoint_dir) / "metrics.jsonl", record)
        self.evaluated = True


class EarlyStopping(Callback):
    """Stops after `patience` evaluations without a `min_delta` improvement of the validation
    loss."""

    def __init__(self, patience: int, min_delta: float = 0.0, metric: str = "loss"):
        self.patience, self.min_delta, self.metric = patience, min_delta, metric
        self.best, self.bad_epochs = math.inf, 0

    def on_eval_end(self, run, metrics):
        value = metrics[self.metric]
        if value < self.best - self.min_delta:
            self.best, self.bad_epochs = value, 0
            return
        self.bad_epochs += 1
        if self.bad_epochs >= self.patience:
            run.request_stop(f"early stopping: validation {self.metric} has not improved by "
                             f"{self.min_delta} for {self.patience} epochs (best {self.best:.3f})")


# How long a partial save must stay gone: the save raises at its first failed write while
# Orbax's other write tasks for the step can still create files in it for a moment.
PARTIAL_SAVE_SETTLE_S = 0.2
PARTIAL_SAVE_ATTEMPTS = 25


def remove_partial_save(checkpoint_dir: Path, step: int) -> None:
    """Remove step `step`'s unfinished save until it stays gone (at most 5 s)."""
    for _ in range(PARTIAL_SAVE_ATTEMPTS):
        partials = list(checkpoint_dir.glob(f"{step}{PARTIAL_STEP_SUFFIX}*"))
        if not partials:
            return
        for partial in partials:
            shutil.rmtree(partial, ignore_errors=True)
        time.sleep(PARTIAL_SAVE_SETTLE_S)


class Checkpointer(Callback):
    """Saves at each evaluated epoch (ranked by validation loss) and, after a stop, at the step
    reached; process 0 then writes the step's config.toml and run record
    (`cvae.training.record`), whose command line is `command` (default `sys.argv`)."""

    def __init__(self, keep: int = 3, command: list[str] | None = None,
                 choices: tuple[str, ...] = ()):
        self.keep = keep
        self.command = sys.argv if command is None else command  # for the run record
        self.choices = choices  # what `cvae train` chose from the data, and why
        self.manager = None
        self.record = None
        self.saved_step = -1

    def on_fit_start(self, run):
        self.manager = create_manager(run.checkpoint_dir, keep=self.keep)
        self.record = create_record(run.config, self.command, started_at=now())
        if self.choices:
            self.record["chosen_from_the_data"] = list(self.choices)

    def save(self, run, metrics):
        try:
            self.saved_step = save_checkpoint(self.manager, run.state, run.config, metrics=metrics)
            if processes.current().is_writer:
                write_step_files(Path(run.checkpoint_dir) / str(self.saved_step), run.config,
                                 self.record)
        except Exception as error:  # Orbax/TensorStore wrap OS errors in their own types
            if "No space left" not in str(error) and getattr(error, "errno", None) != ENOSPC:
                raise
            previous = self.manager.latest_step()
            remove_partial_save(Path(run.checkpoint_dir), run.step)  # give the space back
            raise CheckpointError(
                f"disk full while saving step {run.step} to {run.checkpoint_dir}; the previous "
                f"checkpoint (step {previous}) is intact: free space and run the same command "
                f"to resume") from None

    def on_epoch_end(self, run, metrics):
        self.save(run, {**prefixed(metrics), "epoch": run.epoch + 1})

    def on_fit_end(self, run):
        if self.manager is None:
            return
        # A resumed run that had nothing left to do already has its step on disk.
        on_disk = run.step == self.saved_step or run.step in self.manager.all_steps()
        if not on_disk and run.step > 0 and not run.non_finite:
            self.save(run, None)
        self.manager.close()


class SampleGrid(Callback):
    """Writes a grid (row d = ten samples of class d, fixed seed; grey or RGB as the data is) at
    each evaluation."""

    def __init__(self, seed: int = 0, n: int = 10):
        self.seed, self.n = seed, n
        self.sampler = None

    def on_fit_start(self, run):
        self.sampler = create_sampler(create_model(run.config), run.config, variables={})

    def on_epoch_end(self, run, metrics):
        # This process's copy: only the writer samples, so no program may span the mesh.
        self.sampler.variables = local_copy(run.state.eval_variables())
        images = self.sampler.sample_images(None, self.n, self.seed)
        grid = make_grid(images, cols=self.n, pad=2, scale=1,
                         image_shape=spec_of(run.config.data.dataset).stored_shape)
        save_png(grid, Path(run.checkpoint_dir) / "samples" / f"epoch_{run.epoch + 1:03d}.png")
        save_png(grid, Path(run.checkpoint_dir) / "samples_latest.png")


class TensorBoard(Callback):
    """TensorBoard event files (tensorboardX: no TensorFlow) under `<checkpoint dir>/tensorboard`.

    Per chunk: the step metrics at the chunk's last step (loss terms, learning rate, gradient
    norm, KL weight); per epoch: the validation metrics.
    """

    def __init__(self, subdir: str = "tensorboard"):
        self.subdir = subdir
        self.writer = None

    def on_fit_start(self, run):
        from tensorboardX import SummaryWriter  # imported here: only runs that log need it

        self.writer = SummaryWriter(str(Path(run.checkpoint_dir) / self.subdir))

    def on_step_end(self, run, metrics):
        for name, values in metrics.items():
            self.writer.add_scalar(f"train/{name}", float(np.asarray(values)[-1]), run.step)

    def on_eval_end(self, run, metrics):
        for name, value in metrics.items():
            self.writer.add_scalar(f"{EVAL_SPLIT}/{name}", float(value), run.step)

    def on_fit_end(self, run):
        if self.writer is not None:
            self.writer.close()


class LossCurve(Callback):
    """At the end of training, plots loss and KL per epoch from `metrics.jsonl` into
    `loss_curve.png` (`cvae.training.loss_curve`): train, and each evaluated split."""

    def on_fit_end(self, run):
        path = Path(run.checkpoint_dir) / "metrics.jsonl"
        if not path.exists():
            return
        # imported here: matplotlib loads in ~0.3 s
        from cvae.training.loss_curve import save_loss_curve

        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        save_loss_curve(records, Path(run.checkpoint_dir) / "loss_curve.png")


def default_callbacks(config, *, progress: bool = True, writer: bool = True,
                      command: list[str] | None = None,
                      choices: tuple[str, ...] = ()) -> list[Callback]:
    """What `cvae train` uses: guard first, so nothing logs or saves a non-finite step.

    With `writer=False` (every process but 0 of a multi-process run) only the callbacks that
    decide or take part in collective work remain: the guard, early stopping and the
    checkpointer, whose Orbax saves need every process. Nothing else writes a file.
    `command`: the command line the run records (default `sys.argv`); `choices`: what
    `cvae train` chose from the data, which it records too.
    """
    callbacks = [NanGuard()]
    if writer:
        callbacks += [ProgressBar(disable=None if progress else True), MetricsLogger(),
                      TensorBoard()]
    callbacks.append(Checkpointer(config.run.keep_checkpoints, command, choices))
    if writer:
        callbacks += [SampleGrid(), LossCurve()]
    if config.run.early_stopping_patience:
        callbacks.insert(1, EarlyStopping(config.run.early_stopping_patience,
                                          config.run.early_stopping_min_delta))
    return callbacks


def prefixed(metrics: dict) -> dict:
    """Evaluation metrics named after the split they come from: {"validation_loss": ...}."""
    return {f"{EVAL_SPLIT}_{name}": value for name, value in metrics.items()}


def append_jsonl(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
