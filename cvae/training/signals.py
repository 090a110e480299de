"""SIGINT/SIGTERM from a command's first line on, start-up included (standard library only).

Python's own defaults end a command that is still starting (importing JAX, reading data,
restoring a checkpoint, compiling) with a bare signal death (SIGTERM: exit 143, no line) or a
KeyboardInterrupt traceback (SIGINT). `cvae train`, `cvae serve` and `cvae launch` call
`install()` first thing (`cvae.cli.main.main`), and a signal then has one of two effects:

- `STOP_NOW` (a single-process `cvae train` until the training loop's handler takes over,
  `cvae serve` until gunicorn's arbiter runs, `cvae launch` until it starts its processes):
  the signal raises `Interrupted` where the command is, which the command line turns into one
  line on stderr and exit 0 (`EXIT_INTERRUPTED`). Start-up only reads (data, a checkpoint) and
  compiles; its few writes that must not be cut in half (the checkpoint folder's write probe,
  `--fresh` moving the previous run aside, unreadable steps moved aside) are `deferred()`: the
  signal waits for the block to end.
- `NOTE` (a multi-process `cvae train` from its first line, where one process leaving alone
  would leave its peers waiting in a collective; every command once its own handler has taken
  over): the signal is only noted. The training loop's handler takes it over
  (`take_pending()` in `cvae.training.loop.stop_on_signals`): every process stops before its
  first chunk, nothing new is saved, and `cvae train` exits 0.

A process started with SIGINT and SIGTERM blocked (`cvae launch` starts its processes so) gets
a signal sent before `install()` once the handler is in place: it is never lost, and never
kills a process that has not set its handler yet.
"""

from __future__ import annotations

import contextlib
import signal
import sys

STOP_NOW, NOTE = "stop now", "note"
SIGNALS = (signal.SIGINT, signal.SIGTERM)
# A stop asked for by a signal is a clean stop: nothing was lost, a later run resumes.
EXIT_INTERRUPTED = 0


class Interrupted(BaseException):
    """A signal during start-up (a BaseException, like KeyboardInterrupt: no `except
    Exception` on the way swallows it)."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"interrupted by {self.name}")


class _State:
    mode: str | None = None  # None: not installed
    pending: int | None = None  # the first signal noted and not yet taken over
    deferring: int = 0
    previous: dict = {}
    previous_unraisable_hook = None


def _handler(signum, _frame) -> None:
    # Noted even when it raises: Python drops an exception raised inside a garbage-collection
    # callback or a finaliser ("Exception ignored in ..."), and a signal landing there would
    # be lost; noted, the training loop still stops on it before its first chunk.
    if _State.pending is None:
        _State.pending = signum
    if _State.mode == STOP_NOW and not _State.deferring:
        raise Interrupted(signum)


def _unraisable(unraisable) -> None:
    """An `Interrupted` that Python dropped is already noted (`_handler`): no traceback for it."""
    if not isinstance(unraisable.exc_value, Interrupted):
        _State.previous_unraisable_hook(unraisable)


def install(mode: str = STOP_NOW) -> None:
    """Handle SIGINT and SIGTERM in `mode` from now on, then let through any that waited."""
    _State.mode, _State.pending, _State.deferring = mode, None, 0
    try:
        _State.previous = {sig: signal.signal(sig, _handler) for sig in SIGNALS}
    except ValueError:  # not the main thread (a test calling main()): leave signals alone
        _State.mode = None
        return
    _State.previous_unraisable_hook, sys.unraisablehook = sys.unraisablehook, _unraisable
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)  # a waiting signal is handled here


def uninstall() -> None:
    """The handlers from before `install()` (for callers of `main()` within a process)."""
    if _State.mode is not None:
        for sig, previous in _State.previous.items():
            signal.signal(sig, previous)
        sys.unraisablehook = _State.previous_unraisable_hook
    _State.mode, _State.pending = None, None


def note_only() -> None:
    """From now on a signal is noted, for the training loop to take over (`NOTE`)."""
    if _State.mode is not None:
        _State.mode = NOTE


def installed() -> bool:
    return _State.mode is not None


@contextlib.contextmanager
def deferred():
    """A signal during the block raises `Interrupted` only once the block is done."""
    _State.deferring += 1
    try:
        yield
    finally:
        _State.deferring -= 1
    if _State.mode == STOP_NOW and not _State.deferring and _State.pending is not None:
        raise Interrupted(_State.pending)


def take_pending() -> int | None:
    """The signal noted before the caller's own handler replaced this one, if any (once)."""
    signum, _State.pending = _State.pending, None
    return signum


def block_in_child() -> None:
    """In a child before exec (`preexec_fn`): SIGINT and SIGTERM wait until its `install()`."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
