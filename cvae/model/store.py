"""A trained model as stored: the checkpoint format, and reading a model back for inference.

The format, defined here once: a directory with one folder per step (an Orbax
`CheckpointManager`), each holding three items: `state` (the train state as a PyTree: params,
optimizer state, EMA params, BatchNorm statistics, the mixture prior, the labelled set, step and
key), `config` (the run's `Config` as JSON, so the directory describes itself), `dataset` (its
dataset's spec as JSON, registered on read, so a model of one's own data needs no data folder;
checkpoints written before it have none and name a built-in dataset) and `metrics` (the
validation figures that ranked the step: the best step is the one with the lowest
`BEST_METRIC`, as the writer's manager ranks them); beside them, `config.toml` and
`record.json` (what made the run: `cvae.training.record`). Training writes it
(`cvae.training.checkpoints`); sampling, evaluation and the service read it here.

Inference needs the variables the model applies, not the optimizer: `load_trained_model`
restores only the weights (the EMA ones when the run kept them), the BatchNorm statistics, the
mixture prior and the labelled set, with Orbax's partial restore of the `state` item. The
optimizer state is skipped on disk and no optimizer or train state is built, so a reader needs
nothing of training. Readers open the directory read-only: they never delete or write there.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path
from typing import Any, Callable, Literal

import jax
import orbax.checkpoint as ocp

from cvae.config.sections import Config
from cvae.data import specs
from cvae.errors import CheckpointError, StepNotFound
from cvae.model.registry import create_model
from cvae.data.specs import spec_of

log = logging.getLogger(__name__)

STATE, CONFIG, DATASET, METRICS = "state", "config", "dataset", "metrics"
ITEMS = (STATE, CONFIG, DATASET, METRICS)
# Files beside the items, written by process 0 after a step commits (`cvae.training.record`):
# the config as TOML and the run record, for people and tools that do not read Orbax.
CONFIG_FILE, RECORD_FILE = "config.toml", "record.json"
# What a damaged, half-deleted or vanished step raises when read.
READ_ERRORS = (OSError, ValueError, KeyError)
# Orbax writes a step under `<step>` + this suffix and renames it when the step is whole.
PARTIAL_STEP_SUFFIX = ".orbax-checkpoint-tmp"

# Training evaluates on the validation split only; its figures are stored as "validation_<term>"
# and the best step is the lowest validation loss. (Checkpoints from before the split stored
# test figures as plain "loss": they rank as worst, so they are never kept as "best" over new
# steps.)
EVAL_SPLIT = "validation"
BEST_METRIC = f"{EVAL_SPLIT}_loss"

# Which step a reader takes (`--step`): a step number, the best by `BEST_METRIC`, or the newest
# that reads.
StepChoice = int | Literal["best", "latest"]


def best_metric(metrics: dict | None) -> float:
    """A step's rank for "best" (lower is better): the writer's retention and readers use it."""
    return float((metrics or {}).get(BEST_METRIC, math.inf))


class _DropReadOnlyNotice(logging.Filter):
    """Orbax warns whenever a manager is opened read-only; readers do that on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Given directory is read only")


logging.getLogger("absl").addFilter(_DropReadOnlyNotice())


def open_read_only(directory: str | Path, *, ranked: bool = False) -> ocp.CheckpointManager:
    """A manager that only reads `directory`: it never deletes, writes or creates anything.
    `ranked`: it also reads every step's metrics, to answer `best_step()` as the writer does."""
    ranking = {"best_fn": best_metric, "best_mode": "min"} if ranked else {}
    options = ocp.CheckpointManagerOptions(save_interval_steps=0, enable_async_checkpointing=False,
                                           read_only=True, create=False, **ranking)
    return ocp.CheckpointManager(Path(directory).absolute(), options=options, item_names=ITEMS)


def best_step(manager: ocp.CheckpointManager) -> int:
    """The step with the lowest validation loss, by Orbax's own ranking (`best_fn`, "min") on a
    manager opened `ranked`; a CheckpointError when no step recorded one."""
    step = manager.best_step()
    if step is None or math.isinf(best_metric(manager.metrics(step))):
        raise CheckpointError(f"no step in {manager.directory} records a {BEST_METRIC}, so none "
                              f"is best: choose --step N or latest (steps there: "
                              f"{', '.join(map(str, manager.all_steps())) or 'none'})")
    return step


def chosen_step(manager: ocp.CheckpointManager, choice: StepChoice | None) -> int | None:
    """The step `choice` names: a number that must exist (else StepNotFound, listing those
    that do), the best one, or None for "latest" (the newest that reads)."""
    if choice is None or choice == "latest":
        return None
    if choice == "best":
        return best_step(manager)
    if choice not in manager.all_steps():
        raise StepNotFound(manager.directory, choice, manager.all_steps())
    return choice


def save_args(state, config: Config, metrics: dict[str, Any] | None) -> ocp.args.Composite:
    """One step's items as the writer saves them (`cvae.training.checkpoints.save_checkpoint`)."""
    return ocp.args.Composite(**{STATE: ocp.args.StandardSave(state),
                                 CONFIG: ocp.args.JsonSave(config.to_dict()),
                                 DATASET: ocp.args.JsonSave(spec_of(config.data.dataset).to_dict()),
                                 METRICS: ocp.args.JsonSave(metrics or {})})


def item_path(manager: ocp.CheckpointManager, step: int, item: str) -> Path:
    """Where step `step` keeps `item` (Orbax's default layout, which every writer here uses)."""
    return Path(manager.directory) / str(step) / item


def read_config(manager: ocp.CheckpointManager, step: int) -> Config:
    """The step's config, after registering the dataset spec it carries (when it has one), so
    that the config's `dataset` resolves whatever reads it: every reader comes through here."""
    items = [CONFIG]
    if item_path(manager, step, DATASET).is_dir():
        items.append(DATASET)
    restored = manager.restore(step, args=ocp.args.Composite(
        **{item: ocp.args.JsonRestore() for item in items}))
    if DATASET in items:
        specs.register(specs.DatasetSpec.from_dict(restored[DATASET]))
    return Config.from_dict(restored[CONFIG])


def read_record(directory: str | Path, step: int) -> dict[str, Any] | None:
    """Step `step`'s run record (`cvae.training.record`); None for a step saved before runs
    were recorded, or whose record does not read."""
    try:
        return json.loads((Path(directory) / str(step) / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return None


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


def read_directory(directory: str | Path, read_fn: Callable[[ocp.CheckpointManager, int], Any],
                   step: StepChoice | None = None):
    """`read_fn(manager, step)` for the step `step` chooses (`chosen_step`), or for the newest
    step that reads; a `CheckpointError` saying what to run when the directory holds none."""
    directory = Path(directory)
    hint = f"run `make train` (or `cvae train --checkpoint-dir {directory}`)"
    if not directory.is_dir():
        raise CheckpointError(f"no checkpoint directory at {directory.absolute()}: {hint}")
    manager = open_read_only(directory, ranked=step == "best")
    try:
        if not manager.all_steps():
            raise CheckpointError(f"no checkpoint in {directory.absolute()}: {hint}")
        step = chosen_step(manager, step)
        if step is not None:
            return read_fn(manager, step)
        found = restore_newest_readable(manager, lambda candidate: read_fn(manager, candidate))
        if found is None:
            raise CheckpointError(f"no readable checkpoint in {directory.absolute()} "
                                  f"(steps {manager.all_steps()} all failed to read): {hint}")
        return found[1]
    finally:
        manager.close()


@dataclasses.dataclass(frozen=True)
class TrainedModel:
    """What inference needs of one checkpoint step."""

    step: int
    config: Config
    # What a model's `apply` takes: {"params", and "batch_stats" with BatchNorm, "prior" with the
    # mixture prior}; the EMA weights as "params" when the run kept them (unless not asked for).
    variables: dict
    metrics: dict
    # A `--labels N` run's labelled set, {"indices": i32[N] (rows of the training file),
    # "labels": i32[N]}; {} for a run trained with every label.
    labelled: dict


def inference_items(config: Config, *, use_ema: bool = True) -> dict[str, str]:
    """The `state` fields inference restores, each under the variables' name it takes."""
    weights = "ema_params" if use_ema and config.optimizer.ema_decay > 0 else "params"
    items = {weights: "params"}
    if config.model.component.keeps_batch_stats(config.model.options):
        items["batch_stats"] = "batch_stats"
    if config.prior.component.draws_from_mixture:  # fitted, or learnt and written there
        items["prior"] = "prior"
    if create_model(config).has_classifier:
        items["labelled"] = "labelled"
    return items


def _inference_target(manager: ocp.CheckpointManager, step: int, fields: dict[str, str]
                      ) -> dict:
    """Shapes and dtypes of the restored fields as the step stored them (Orbax's metadata, read
    in milliseconds: tracing the model's init for them took a fifth of a served model's cached
    start), placed on one local device whatever device count wrote the checkpoint. That the
    config's model makes these shapes is checked where they are applied: Flax raises
    `ScopeParamShapeError` for a weight whose shape its module does not make."""
    stored = ocp.PyTreeCheckpointHandler().metadata(item_path(manager, step, STATE)).tree
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                        {field: stored[field] for field in fields})


def read_trained_model(manager: ocp.CheckpointManager, step: int, *, use_ema: bool = True
                       ) -> TrainedModel:
    """Step `step` for inference: a partial restore of `state` (module docstring)."""
    config = read_config(manager, step)
    fields = inference_items(config, use_ema=use_ema)
    target = _inference_target(manager, step, fields)
    restored = manager.restore(step, args=ocp.args.Composite(**{
        STATE: ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
            partial_restore=True),
        METRICS: ocp.args.JsonRestore()}))
    state = restored[STATE]
    variables = {name: state[field] for field, name in fields.items() if name != "labelled"}
    return TrainedModel(step, config, variables, dict(restored[METRICS] or {}),
                        state.get("labelled", {}))


def load_trained_model(directory: str | Path, step: StepChoice | None = None, *,
                       use_ema: bool = True) -> TrainedModel:
    """The newest readable (or the chosen: `StepChoice`) step of `directory`, for inference: what
    `cvae sample`, `cvae eval` and the service read. `use_ema=False` reads the trained weights
    themselves rather than their moving average (what `--init-from` copies)."""
    return read_directory(directory, lambda manager, candidate: read_trained_model(
        manager, candidate, use_ema=use_ema), step)
