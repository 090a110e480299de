"""Which checkpoint a service process serves, and moving to newer ones as they appear.

A `CheckpointWatcher` thread polls the checkpoint directory every `poll_interval` seconds (or
when woken, e.g. on SIGHUP) and swaps in the step that `cvae serve --step` chooses: the newest
readable one (`latest`), the one with the lowest validation loss as the writer ranks them
(`best`, re-ranked whenever the step folders change), or one fixed step (never rolled
forward). The served model is one
immutable `Loaded` object behind a reference, so a swap is atomic and a request keeps the
weights it started with. Every process (worker or replica) runs its own watcher over the same
directory, so all of them converge on the newest step within one poll interval, with no
coordination between them.

The directory is only read: Orbax's `CheckpointManager` may delete steps and is not safe to
share between processes, so readers go through `cvae.sampling.sampler.load_sampler`'s read-only
path. A corrupt or half-written newest step is skipped, logged and named in `note`, and tried
again once its files change (an export still being copied in); a step that vanishes while
being read is tolerated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import jax
import numpy as np

from cvae.errors import CheckpointError, StepNotFound
from cvae.export.manifest import step_folders
from cvae.export.load import exported_step, open_sampler
from cvae.export.manifest import is_export
from cvae.sampling.blocks import ROW_BY_ROW
from cvae.sampling.grid import encoder_signature
from cvae.sampling.sampler import Sampler

if TYPE_CHECKING:
    from cvae.model.store import StepChoice  # Orbax: imported at run time only when ranking

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Loaded:
    """The model being served: replaced as a whole, never mutated."""

    sampler: Sampler
    step: int
    version: int  # `step_version`: to notice a step rewritten under the same number
    loaded_at: float
    # sha256 of the weights, the config, JAX version and backend: what decides a seeded PNG's
    # bytes besides the request, so replicas serving equal weights give equal ETags.
    fingerprint: str


def fingerprint(sampler: Sampler) -> str:
    """sha256 of what decides a seeded picture's bytes besides its parameters: the weights, the
    config (its sharpness and truncation among them, which `cvae serve --truncation` changes),
    the JAX version and backend, the bits this machine's kernels give `decode` (replicas on
    CPUs whose kernels round differently get different fingerprints, so their ETags differ
    too), and the PNG encoder's (`encoder_signature`). Walks and transfers run more functions,
    checked after the first answer: their ETags add those functions' bits
    (`Sampler.signature`)."""
    digest = hashlib.sha256(f"{jax.__version__} {jax.default_backend()}".encode())
    digest.update(encoder_signature())
    digest.update(sampler.config.to_json().encode())
    digest.update(sampler.drawing_signature)
    for leaf in jax.tree.leaves(sampler.variables):
        array = np.asarray(leaf)
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def list_steps(directory: Path) -> list[int]:
    """Committed step folders, newest first (Orbax names temporary folders non-numerically);
    an exported folder's one step (cvae/export/)."""
    try:
        return [exported_step(directory)] if is_export(directory) else step_folders(directory)
    except (OSError, CheckpointError):  # vanished while listing, or no manifest
        return []


def step_version(directory: Path, step: int) -> int | None:
    """What changes when `step` is rewritten, or while it is still being written (None: it is
    gone): its folder's mtime; for an exported folder, every file's name, size and mtime. Not
    the manifest's alone: files copied in one by one (`kubectl cp`, tar) may bring it first,
    its mtime already final, so a load refused for a file not yet whole would never be tried
    again (docs/service-deployment.md: copy under a temporary name, then rename)."""
    if not is_export(directory):
        return _mtime_ns(directory / str(step))
    try:
        files = sorted((path.name, path.stat().st_size, path.stat().st_mtime_ns)
                       for path in directory.iterdir() if path.is_file())
    except OSError:  # a file vanished while listing
        return None
    return int.from_bytes(hashlib.sha256(repr(files).encode()).digest()[:8], "big")


def _mtime_ns(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def load(directory: Path, step: int, truncation: float | None = None, *,
         check: str = "all") -> Loaded:
    """Read, compile and fingerprint one step (slow: seconds), drawing at `truncation` (None:
    the run's own). `check="first"`: compile and check one block size, leaving the others and
    the warm-up to `finish_checks` (the fingerprint is the same either way: every size kept
    later gives the first one's bits)."""
    version = step_version(directory, step)
    if version is None:
        raise FileNotFoundError(f"step {step} vanished")
    sampler = open_sampler(directory, step, truncation=truncation, check=check)
    if check != "first":
        sampler.warm_up()
    if not sampler.blocks_unchecked:
        log_blocks(sampler)
    return Loaded(sampler, step, version, time.time(), fingerprint(sampler))


def finish_checks(sampler: Sampler) -> None:
    """What `load(check="first")` left for after the first answer: the warm-up (0.1 to 0.2 s of
    a start; a request before it compiles its latent draw itself, from the cache), then the
    other functions' blocks and the larger sizes, saying which were dropped."""
    sampler.warm_up()
    if sampler.blocks_unchecked:
        sampler.check_remaining_blocks()
        log_blocks(sampler)


def log_blocks(sampler: Sampler) -> None:
    if sampler.block_sizes == ROW_BY_ROW:
        log.warning("no decode block size keeps a row's bits at every position with this "
                    "machine's kernels: decoding one row per call (slower, still bit-identical)")
    elif sampler.dropped_blocks:
        log.info("decode blocks of %s rows give other bits with this machine's kernels; "
                 "using %s", sampler.dropped_blocks, sampler.block_sizes)
    if sampler.dropped_code_blocks:
        log.info("code blocks of %s rows give other bits with this machine's kernels; "
                 "using %s", sampler.dropped_code_blocks, sampler.code_block_sizes)
    if sampler.dropped_classify_blocks:
        log.info("classify blocks of %s rows give other bits with this machine's kernels; "
                 "using %s", sampler.dropped_classify_blocks, sampler.classify_block_sizes)


StepHook = Callable[[str, int], None]  # ("loaded" | "failed", step), for metrics


class CheckpointWatcher:
    """Holds the served `Loaded` model and replaces it when a newer step becomes readable."""

    def __init__(self, directory: str | Path, poll_interval: float = 2.0,
                 on_load: StepHook | None = None, truncation: float | None = None,
                 step: StepChoice = "latest"):
        self.directory = Path(directory).absolute()
        self.poll_interval, self.on_load = poll_interval, on_load
        self.truncation = truncation  # every step drawn at this, not its own (None: its own)
        self.step = step  # which step to serve: a number, "best" or "latest"
        self.current: Loaded | None = None
        self._ranked: tuple[tuple, int | None, str | None] = ((), None, None)  # best_of's cache
        self._unwanted: str | None = None  # why no step is chosen, when none is
        self.note: str | None = None  # why not ready, or which newer step was skipped
        self.failed: dict[tuple[int, int], str] = {}  # (step, step_version) -> reason
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._poll, name="cvae-checkpoints", daemon=True)

    def refresh(self, *, check: str = "all") -> None:
        """Load the chosen step if it is not the one served (poller thread). `check="first"`: at
        start-up, compile one block size and leave the rest to the poller (`finish_checks`).

        For `latest`, that means the newest readable step newer than the served one; when the
        served step's folder vanished or was rewritten (`cvae train --fresh` sets old runs
        aside), any step will do. For `best` or a step number, the one step chosen.
        """
        steps = list_steps(self.directory)
        current = self.current
        unchanged = (current is not None
                     and step_version(self.directory, current.step) == current.version)
        candidates = self.chosen(steps)
        if unchanged:
            candidates = [s for s in candidates
                          if (s > current.step if self.step == "latest" else s != current.step)]
        skipped = []
        for step in candidates:
            reason = self._try_load(step, check)
            if reason is None:
                break
            skipped.append(f"step {step}: {reason}")
        self._update_note(skipped)

    def chosen(self, steps: list[int]) -> list[int]:
        """The steps `self.step` allows, in order of preference (`steps`: newest first)."""
        if self.step == "latest":
            return steps
        chosen = self.best_of(steps) if self.step == "best" else self.step
        self._unwanted = (None if chosen in steps or not steps else
                          self._ranked[2] if chosen is None else
                          str(StepNotFound(self.directory, chosen, steps)))
        return [chosen] if chosen in steps else []

    def best_of(self, steps: list[int]) -> int | None:
        """The best step, ranked by Orbax as the writer ranks them (`cvae.model.store`); ranked
        again only when the step folders change, since it reads every step's metrics."""
        key = tuple((s, step_version(self.directory, s)) for s in steps)
        if key != self._ranked[0]:
            best, why = None, None
            if is_export(self.directory):
                best = steps[0] if steps else None  # its one step is its best
            elif steps:
                from cvae.model import store  # Orbax: imported when first needed

                manager = store.open_read_only(self.directory, ranked=True)
                try:
                    best = store.best_step(manager)
                except Exception as error:  # a step vanishing mid-read must not stop the poll
                    why = str(error).splitlines()[0] if str(error) else type(error).__name__
                finally:
                    manager.close()
            self._ranked = (key, best, why)
        return self._ranked[1]

    def _try_load(self, step: int, check: str = "all") -> str | None:
        """Loads and swaps in `step`; returns None, or why it could not."""
        key = (step, step_version(self.directory, step))
        if key[1] is None:
            return "vanished"
        if key in self.failed:
            return self.failed[key]
        try:
            loaded = load(self.directory, step, self.truncation, check=check)
        except Exception as error:  # a corrupt or half-deleted step must not stop the service
            reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            self.failed[key] = reason
            self._notify("failed", step)
            log.warning("cannot load checkpoint step %d in %s (%s); %s", step, self.directory,
                        reason, f"keeping step {self.current.step}" if self.current
                        else "nothing to serve yet")
            return reason
        self.current = loaded
        self._notify("loaded", step)
        log.info("serving checkpoint step %d from %s", step, self.directory)
        return None

    def _notify(self, outcome: str, step: int) -> None:
        if self.on_load is not None:
            self.on_load(outcome, step)

    def _update_note(self, skipped: list[str]) -> None:
        if self.current is None and self._unwanted and not skipped:
            self.note = f"--step {self.step}: {self._unwanted}"
        elif self.current is None:
            where = (f"no checkpoint in {self.directory}" if not skipped
                     else f"no readable checkpoint in {self.directory} ({'; '.join(skipped)})")
            self.note = (f"{where}: run `make train` (or `cvae train --checkpoint-dir "
                         f"{self.directory}`); the service picks it up when it appears")
        elif skipped:
            self.note = (f"serving step {self.current.step}: the chosen checkpoint(s) could not "
                         f"be read ({'; '.join(skipped)})")
        else:
            self.note = None

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _poll(self) -> None:
        if self.current is not None:
            try:  # the block sizes start-up left unchecked, before anything else
                finish_checks(self.current.sampler)
            except Exception:  # the sizes checked so far keep serving
                log.exception("checking the remaining block sizes failed")
        while True:
            self._wake.wait(self.poll_interval)
            self._wake.clear()
            if self._stopping:
                return
            try:
                self.refresh()
            except Exception:  # never let the poller die
                log.exception("checkpoint poll of %s failed", self.directory)
