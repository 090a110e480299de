"""SIGINT/SIGTERM at any moment of `cvae train`, `cvae serve` and `cvae launch`, start-up included.

The start-up handler (`cvae.training.signals`) is the first thing these commands install,
before the parser imports JAX; the command's own (the training loop's, gunicorn's, the
launcher's) takes over from it. A signal during start-up ends with one line on stderr and exit
0 (`STARTUP_STOPS`): nothing was written that could be left half done, and the same command
starts or resumes the run.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Callable

from cvae.training import signals as startup_signals

# For `cvae train`'s few start-up writes: a signal during the block waits for its end.
deferred = startup_signals.deferred

# What a signal during start-up leaves, said after "cvae COMMAND: interrupted by SIGTERM".
STARTUP_STOPS = {
    "train": "during start-up, before training began; nothing to save: the same command "
             "starts or resumes the run",
    "serve": "during start-up, before it listened; nothing was served",
    "launch": "before its processes started; nothing to save",
}


def several_processes(argv: list[str]) -> bool:
    """Whether `cvae train` runs as one of several processes (`--num-processes N`, N > 1),
    read before the full parser (which imports JAX) has run."""
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--num-processes", default="1")
    count = peek.parse_known_args(argv[1:])[0].num_processes
    return count.isdigit() and int(count) > 1


def guarded(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
    """`main(argv)`, under the start-up handler for the commands of `STARTUP_STOPS`.

    As the process itself (no `argv`), signals are still noted while the interpreter exits, and
    a start-up stop leaves with `os._exit`: the signal may have cut JAX short (an import, a
    compile, a transfer), and the interpreter's exit would wait on, or crash in, what it left
    running; nothing is pending then. Called with `argv` (a test), the previous handlers come
    back when `main` returns.
    """
    @functools.wraps(main)
    def guarded_main(argv: list[str] | None = None) -> int:
        in_process = argv is not None
        words = list(argv) if in_process else sys.argv[1:]
        command = words[0] if words else None
        if command not in STARTUP_STOPS:
            return main(argv)
        try:
            startup_signals.install(startup_signals.NOTE if command == "train"
                                    and several_processes(words) else startup_signals.STOP_NOW)
            return main(argv)
        except startup_signals.Interrupted as stop:
            print(f"cvae {command}: {stop} {STARTUP_STOPS[command]}", file=sys.stderr,
                  flush=True)
            if in_process:
                return startup_signals.EXIT_INTERRUPTED
            sys.stdout.flush()
            os._exit(startup_signals.EXIT_INTERRUPTED)
        finally:
            if in_process:
                startup_signals.uninstall()
            else:
                startup_signals.note_only()
    return guarded_main
