"""Self-describing Orbax checkpoints: train state + config JSON + metrics, one step per folder.

Also where a run starts from (`start_state`): the newest readable checkpoint if its config
agrees (resume), a fresh state with the previous run set aside (`--fresh`), or another run's
weights (`--init-from`).

Retention is "the latest `keep` and the best 1 by validation loss", written as an explicit Orbax
preservation policy: with plain `max_to_keep` + `best_fn`, Orbax keeps only the best N and may
delete the newest step (orbax #526). Saves are synchronous and atomic (Orbax writes to a
temporary folder and renames it on commit), so a killed process never leaves a step that
restores half-written. Readers (sample, eval, the service) open the directory read-only: they
never delete or write there.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from cvae.training import processes
from cvae.config import RESUMABLE_CHANGES, Config
from cvae.errors import CheckpointError, ResumeError
from cvae.model.networks import create_model
from cvae.training.optimizer import create_optimizer

log = logging.getLogger(__name__)

ITEMS = ("state", "config", "metrics")
# Training evaluates on the validation split only; its figures are stored as "validation_<term>"
# and the best step is the lowest validation loss. (Checkpoints from before the split stored
# test figures as plain "loss": they rank as worst, so they are never kept as "best" over new
# steps.)
EVAL_SPLIT = "validation"
BEST_METRIC = f"{EVAL_SPLIT}_loss"


class _DropReadOnlyNotice(logging.Filter):
    """Orbax warns whenever a manager is opened read-only; readers do that on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Given directory is read only")


logging.getLogger("absl").addFilter(_DropReadOnlyNotice())


def _best_metric(metrics: dict) -> float:
    return float(metrics.get(BEST_METRIC, math.inf))


def create_manager(directory: str | Path, keep: int = 3, read_only: bool = False
                   ) -> ocp.CheckpointManager:
    directory = Path(directory).absolute()
    retention = policies.AnyPreservationPolicy([
        policies.LatestN(n=keep),
        # reverse=True: BestN keeps the *last* n after sorting, so sort descending to keep the
        # lowest loss. Steps saved without metrics (interrupts) are left to LatestN.
        policies.BestN(get_metric_fn=_best_metric, reverse=True, n=1,
                       keep_checkpoints_without_metrics=False),
    ])
    options = ocp.CheckpointManagerOptions(
        preservation_policy=None if read_only else retention,
        best_fn=_best_metric, best_mode="min",
        save_interval_steps=0 if read_only else 1,
        enable_async_checkpointing=False, read_only=read_only, create=not read_only)
    return ocp.CheckpointManager(directory, options=options, item_names=ITEMS)


def save_checkpoint(manager: ocp.CheckpointManager, state, config: Config,
                    metrics: dict[str, Any] | None, force: bool = True) -> int:
    """Write one step; `metrics` (validation figures) rank it for "best" retention."""
    step = int(jax.device_get(state.step))
    args = ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        config=ocp.args.JsonSave(config.to_dict()),
        metrics=ocp.args.JsonSave(metrics or {}),
    )
    manager.save(step, args=args, metrics=metrics or None, force=force)
    manager.wait_until_finished()
    return step


def read_config(manager: ocp.CheckpointManager, step: int) -> Config:
    restored = manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
    return Config.from_dict(restored.config)


def abstract_state(config: Config, total_steps: int = 1):
    """The train state's structure, shapes and dtypes, built from the config without compute."""
    from cvae.training.step import create_train_state  # local: train imports nothing from here

    model = create_model(config)
    optimizer, _ = create_optimizer(config, total_steps)
    shapes = jax.eval_shape(
        lambda: create_train_state(jax.random.key(config.seed), model, optimizer, config))
    # Readers restore onto one local device whatever device count wrote the checkpoint.
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), shapes)


# Train-state fields added after checkpoints were first written, with the value that means
# "absent" for the runs that wrote them: they restore without the field and get this value.
# The mixture prior (runs before it had the standard prior); the labelled set of --labels N
# (runs before it trained on every label).
NEWER_STATE_FIELDS = {"prior": {}, "labelled": {}}


def restore_state(manager: ocp.CheckpointManager, step: int, template) -> tuple[Any, dict]:
    """Restore the state into `template`'s structure (abstract or concrete) and its metrics.

    A checkpoint written before a field of NEWER_STATE_FIELDS existed lacks it on disk: when the
    template has that field at its "absent" value, the state is restored without it.
    """
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)

    def restore(state_target):
        return manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(state_target), metrics=ocp.args.JsonRestore()))

    try:
        restored = restore(target)
        return restored.state, dict(restored.metrics or {})
    except ValueError as error:
        absent = {name: value for name, value in NEWER_STATE_FIELDS.items()
                  if getattr(target, name, None) == value}
        if "do not match" not in str(error) or not absent:
            raise
    older = {f.name: getattr(target, f.name) for f in dataclasses.fields(target)
             if f.metadata.get("pytree_node", True) and f.name not in absent}
    restored = restore(older)
    return target.replace(**restored.state, **absent), dict(restored.metrics or {})


# What a damaged, half-deleted or vanished step raises when read.
READ_ERRORS = (OSError, ValueError, KeyError)


def restore_newest_readable(manager: ocp.CheckpointManager,
                            restore_fn: Callable[[int], Any]) -> tuple[int, Any] | None:
    """`(step, restore_fn(step))` for the newest step that reads, or None when there is none.

    Steps that fail to read (corrupt, or deleted under us) are skipped with a warning naming them.
    """
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            return step, restore_fn(step)
        except READ_ERRORS as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            log.warning("skipping checkpoint step %d in %s: %s", step, manager.directory, reason)
    return None


@dataclasses.dataclass
class Checkpoint:
    step: int
    config: Config
    state: Any
    metrics: dict


def load_checkpoint(directory: str | Path, step: int | None = None) -> Checkpoint:
    """Read a checkpoint (the newest readable one by default) with nothing but the directory."""
    directory = Path(directory)
    hint = f"run `make train` (or `cvae train --checkpoint-dir {directory}`)"
    if not directory.is_dir():
        raise CheckpointError(f"no checkpoint directory at {directory.absolute()}: {hint}")
    manager = create_manager(directory, read_only=True)
    try:
        if step is None and not manager.all_steps():
            raise CheckpointError(f"no checkpoint in {directory.absolute()}: {hint}")

        def read(candidate: int) -> Checkpoint:
            config = read_config(manager, candidate)
            state, metrics = restore_state(manager, candidate, abstract_state(config))
            return Checkpoint(candidate, config, state, metrics)

        if step is not None:
            return read(step)
        found = restore_newest_readable(manager, read)
        if found is None:
            raise CheckpointError(f"no readable checkpoint in {directory.absolute()} "
                                  f"(steps {manager.all_steps()} all failed to read): {hint}")
        return found[1]
    finally:
        manager.close()


# ---- where a run starts from ---------------------------------------------------------------


def start_state(state, config: Config, checkpoint_dir: str | Path, fresh: bool = False,
                init_from: str | Path | None = None):
    """The state a run in `checkpoint_dir` starts from; `state` is a freshly initialised one.

    `init_from` first copies another run's weights into it; then, unless `fresh`, the newest
    readable checkpoint of `checkpoint_dir` replaces it (`resume_state`). With `fresh`, the
    previous run there is moved aside, never deleted.
    """
    checkpoint_dir = Path(checkpoint_dir)
    if init_from is not None:
        state = initialise_from(state, init_from)
    if fresh:
        if processes.current().is_writer:  # one process moves; the others wait for it
            set_aside_previous_run(checkpoint_dir)
        processes.barrier("fresh: previous run set aside")
        return state
    return resume_state(checkpoint_dir, state, config)


def schedule_span(config: Config) -> int:
    """Epochs the learning-rate schedule spans: `schedule_epochs`, or else `epochs`."""
    return config.schedule_epochs or config.epochs


def keep_schedule_span(checkpoint_dir: str | Path, config: Config) -> Config:
    """`config` with the schedule span of the run it resumes, so the rate never jumps.

    Raising --epochs on a run used to rebuild the schedule over the new total: a run that had
    decayed to 1e-5 went back to about 5e-4. Now the schedule keeps the span the run started
    with, and epochs past it train at the schedule's final rate. An explicit --schedule-epochs
    that differs from the run's span is refused: it would make the rate jump.
    """
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        return config
    manager = create_manager(checkpoint_dir, read_only=True)
    try:
        found = restore_newest_readable(manager, lambda step: read_config(manager, step))
    finally:
        manager.close()
    if found is None or schedule_span(found[1]) == schedule_span(config):
        return config
    stored, span = found[1], schedule_span(found[1])
    if config.schedule_epochs:
        raise ResumeError(
            f"{checkpoint_dir} holds a run whose learning-rate schedule spans {span} epochs; "
            f"--schedule-epochs {config.schedule_epochs} would make the rate jump: pass --fresh "
            f"to start over with it, or leave --schedule-epochs out")
    log.warning("%s: continuing a run planned for %d epochs to %d: the learning-rate schedule "
                "keeps its span of %d epochs, and later epochs train at its final rate; "
                "pass --fresh to train %d epochs on one schedule", checkpoint_dir, stored.epochs,
                config.epochs, span, config.epochs)
    return config.replace(schedule_epochs=span)


def resume_state(checkpoint_dir: Path, state, config: Config):
    """The newest readable checkpoint's state if its config agrees, else `state` (fresh start).

    A different config in any field outside RESUMABLE_CHANGES is a ResumeError listing the
    fields. Steps newer than the one restored that fail to read are moved aside.
    """
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
    # Moved aside, not deleted: training will write these steps again. By process 0 only.
    for step in unreadable if processes.current().is_writer else ():
        target = checkpoint_dir / f"unreadable-{step}-{time.strftime('%Y%m%d-%H%M%S')}"
        (checkpoint_dir / str(step)).rename(target)
        log.warning("moved unreadable checkpoint step %d to %s", step, target)
    processes.barrier("resume: unreadable steps set aside")
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
    log.info("--fresh: moved the previous run in %s to %s", checkpoint_dir, archive)
    return archive


def initialise_from(state, source_dir: str | Path):
    """Copy parameters (and BatchNorm statistics) from another run, e.g. to fine-tune a part."""
    source = load_checkpoint(source_dir)
    params = source.state.params
    return state.replace(params=params, batch_stats=source.state.batch_stats,
                         ema_params=params if state.ema_params is not None else None,
                         opt_state=state.tx.init(params))
