"""Where a run starts from: the newest readable checkpoint if its config agrees (resume), a
fresh state with the previous run set aside (`--fresh`), or another run's weights
(`--init-from`); and the learning-rate schedule's span a resumed run keeps.

Only process 0 moves folders (`--fresh`, unreadable steps); the others wait for it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from cvae.config.sections import RESUMABLE_CHANGES, Config
from cvae.errors import ResumeError
from cvae.model import store
from cvae.training import processes
from cvae.training import signals as startup_signals
from cvae.training.checkpoints import restore_state

log = logging.getLogger(__name__)


def start_state(state, config: Config, checkpoint_dir: str | Path, *, fresh: bool = False,
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
            with startup_signals.deferred():  # a signal waits until every folder has moved
                set_aside_previous_run(checkpoint_dir)
        processes.barrier("fresh: previous run set aside")
        return state
    return resume_state(checkpoint_dir, state, config)


def schedule_span(config: Config) -> int:
    """Epochs the learning-rate schedule spans: `schedule_epochs`, or else `epochs`."""
    return config.optimizer.schedule_epochs or config.run.epochs


def stored_config(checkpoint_dir: str | Path) -> Config | None:
    """The config of `checkpoint_dir`'s newest readable checkpoint; None where it holds none."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        return None
    manager = store.open_read_only(checkpoint_dir)
    try:
        found = store.restore_newest_readable(
            manager, lambda step: store.read_config(manager, step))
    finally:
        manager.close()
    return None if found is None else found[1]


def keep_schedule_span(checkpoint_dir: str | Path, config: Config) -> Config:
    """`config` with the schedule span of the run it resumes, so the rate never jumps.

    Raising --epochs on a run used to rebuild the schedule over the new total: a run that had
    decayed to 1e-5 went back to about 5e-4. Now the schedule keeps the span the run started
    with, and epochs past it train at the schedule's final rate. An explicit --schedule-epochs
    that differs from the run's span is refused: it would make the rate jump.
    """
    stored = stored_config(checkpoint_dir)
    if stored is None or schedule_span(stored) == schedule_span(config):
        return config
    span = schedule_span(stored)
    if config.optimizer.schedule_epochs:
        raise ResumeError(
            f"{checkpoint_dir} holds a run whose learning-rate schedule spans {span} epochs; "
            f"--schedule-epochs {config.optimizer.schedule_epochs} would make the rate jump: "
            f"pass --fresh to start over with it, or leave --schedule-epochs out")
    log.warning("%s: continuing a run planned for %d epochs to %d: the learning-rate schedule "
                "keeps its span of %d epochs, and later epochs train at its final rate; "
                "pass --fresh to train %d epochs on one schedule", checkpoint_dir,
                stored.run.epochs, config.run.epochs, span, config.run.epochs)
    return config.replace(schedule_epochs=span)


def resume_state(checkpoint_dir: Path, state, config: Config):
    """The newest readable checkpoint's state if its config agrees, else `state` (fresh start).

    A different config in any setting outside RESUMABLE_CHANGES is a ResumeError listing the
    settings. Steps newer than the one restored that fail to read are moved aside.
    """
    def restore(step: int):
        differences = {path: values for path, values in
                       store.read_config(manager, step).diff(config).items()
                       if path not in RESUMABLE_CHANGES}
        if differences:
            listed = ", ".join(f"{k}: checkpoint {a!r} vs requested {b!r}"
                               for k, (a, b) in differences.items())
            raise ResumeError(f"{checkpoint_dir} holds a run with a different config ({listed}); "
                              f"pass --fresh to start over there, or use another --checkpoint-dir")
        return restore_state(manager, step, state)[0]

    manager = store.open_read_only(checkpoint_dir)
    try:
        found = store.restore_newest_readable(manager, restore)
        unreadable = [s for s in manager.all_steps() if found is None or s > found[0]]
    finally:
        manager.close()
    # Moved aside, not deleted: training will write these steps again. By process 0 only.
    with startup_signals.deferred():  # a signal during start-up waits for the moves
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
    source = store.load_trained_model(source_dir, use_ema=False)
    params = source.variables["params"]
    return state.replace(params=params, batch_stats=source.variables.get("batch_stats", {}),
                         ema_params=params if state.ema_params is not None else None,
                         opt_state=state.tx.init(params))
