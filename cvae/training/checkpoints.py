"""Writing checkpoints, in the format of `cvae.model.store`, and reading a whole train state back.

Retention is "the latest `keep` and the best 1 by validation loss", written as an explicit Orbax
preservation policy: with plain `max_to_keep` + `best_fn`, Orbax keeps only the best N and may
delete the newest step (orbax #526). Saves are synchronous and atomic (Orbax writes to a
temporary folder and renames it on commit), so a killed process never leaves a step that
restores half-written. Resuming restores everything, optimizer state included
(`restore_state`); inference reads only what the model applies (`cvae.model.store`). Where a
run starts from (resume, `--fresh`, `--init-from`) is `cvae.training.start`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from cvae.config.sections import Config
from cvae.model import store
from cvae.model.store import best_metric
from cvae.model.registry import create_model
from cvae.training.optimizer import create_optimizer
from cvae.training.step import create_train_state

def create_manager(directory: str | Path, *, keep: int = 3) -> ocp.CheckpointManager:
    """The writer's manager: keeps the latest `keep` steps and the best one."""
    retention = policies.AnyPreservationPolicy([
        policies.LatestN(n=keep),
        # reverse=True: BestN keeps the *last* n after sorting, so sort descending to keep the
        # lowest loss. Steps saved without metrics (interrupts) are left to LatestN.
        policies.BestN(get_metric_fn=best_metric, reverse=True, n=1,
                       keep_checkpoints_without_metrics=False),
    ])
    options = ocp.CheckpointManagerOptions(
        preservation_policy=retention, best_fn=best_metric, best_mode="min",
        save_interval_steps=1, enable_async_checkpointing=False, create=True)
    return ocp.CheckpointManager(Path(directory).absolute(), options=options,
                                 item_names=store.ITEMS)


# Orbax warns on every save without metrics when a best step is tracked. An interrupt's save has
# none by design (LatestN keeps it, BestN ranks evaluated steps only), so the warning says nothing.
NO_METRICS_WARNING = "Requested `tracked_metric`; did not provide metrics."


@contextlib.contextmanager
def _without_no_metrics_warning():
    def drop(record: logging.LogRecord) -> bool:
        return record.getMessage() != NO_METRICS_WARNING

    absl = logging.getLogger("absl")
    absl.addFilter(drop)
    try:
        yield
    finally:
        absl.removeFilter(drop)


def save_checkpoint(manager: ocp.CheckpointManager, state, config: Config,
                    *, metrics: dict[str, Any] | None, force: bool = True) -> int:
    """Write one step; `metrics` (validation figures) rank it for "best" retention."""
    step = int(jax.device_get(state.step))
    with _without_no_metrics_warning():
        manager.save(step, args=store.save_args(state, config, metrics),
                     metrics=metrics or None, force=force)
    manager.wait_until_finished()
    return step


def abstract_state(config: Config, total_steps: int = 1):
    """The train state's structure, shapes and dtypes, built from the config without compute."""
    model = create_model(config)
    optimizer, _ = create_optimizer(config, total_steps)
    shapes = jax.eval_shape(
        lambda: create_train_state(model, optimizer, config, key=jax.random.key(config.run.seed)))
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
        restored = manager.restore(step, args=ocp.args.Composite(**{
            store.STATE: ocp.args.StandardRestore(state_target),
            store.METRICS: ocp.args.JsonRestore()}))
        return restored[store.STATE], dict(restored[store.METRICS] or {})

    try:
        return restore(target)
    except ValueError as error:
        absent = {name: value for name, value in NEWER_STATE_FIELDS.items()
                  if getattr(target, name, None) == value}
        if "do not match" not in str(error) or not absent:
            raise
    older = {f.name: getattr(target, f.name) for f in dataclasses.fields(target)
             if f.metadata.get("pytree_node", True) and f.name not in absent}
    state, metrics = restore(older)
    return target.replace(**state, **absent), metrics


@dataclasses.dataclass
class Checkpoint:
    """One step's whole train state, optimizer included (what a resume restores)."""

    step: int
    config: Config
    state: Any
    metrics: dict


def load_checkpoint(directory: str | Path, step: int | None = None) -> Checkpoint:
    """The whole train state of the newest readable (or the given) step of `directory`.

    Inference reads less: `cvae.model.store.load_trained_model`."""
    def read(manager: ocp.CheckpointManager, candidate: int) -> Checkpoint:
        config = store.read_config(manager, candidate)
        state, metrics = restore_state(manager, candidate, abstract_state(config))
        return Checkpoint(candidate, config, state, metrics)

    return store.read_directory(directory, read, step)
