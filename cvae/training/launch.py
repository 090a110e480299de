"""`cvae launch --local-processes N -- <train flags>`: N `cvae train` processes on this machine.

For tests and for many-core or multi-GPU boxes (process i gets GPU i through JAX's
`JAX_LOCAL_DEVICE_IDS`). The launcher picks a free loopback port for the coordinator, starts
`cvae train <flags> --coordinator-address 127.0.0.1:PORT --num-processes N --process-id i` for
each i, and then only watches:

- SIGINT/SIGTERM are forwarded to every process: they agree to stop after the current chunk,
  save one checkpoint together and exit 0 (still starting, before their first chunk, nothing
  to save); a second signal kills them. Each process is started with both signals blocked
  until its handler is in place (`cvae.training.signals`), so none dies of one while starting.
  A signal before every process was started stops the launch: those started have not joined
  the group yet (it needs all of them) and have written nothing, so they are killed, and the
  launcher says so in one line and exits 0;
- when one process fails, the others are sent SIGTERM and, after `grace` seconds, SIGKILL; the
  launcher exits with the code of the process that failed first and one line naming it (the
  others' failures followed from it: a collective that lost its peer, or JAX's coordination
  service stopping them after the heartbeat timeout);
- each process is asked by the kernel to take SIGTERM if the launcher itself dies (Linux).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

from cvae.errors import ConfigError
from cvae.training import signals as startup_signals

# A process that stops sending heartbeats for this long is declared dead, and JAX then stops
# every other process: the bound on how long the survivors of a frozen or unreachable process
# live on (a killed one closes its sockets, and the others fail within a second).
DEFAULT_HEARTBEAT_TIMEOUT = 30
# `cvae train`'s exit code when it stopped because another process failed: the launcher reports
# the process that failed first, not the ones that followed it.
EXIT_PEER_FAILED = 4
# Flags the launcher sets itself for each process.
RESERVED_FLAGS = ("--coordinator-address", "--num-processes", "--process-id")
POLL_SECONDS = 0.05
_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def train_command(train_flags: list[str], address: str, *, count: int, index: int) -> list[str]:
    return [sys.executable, "-m", "cvae.cli", "train", *train_flags,
            "--coordinator-address", address, "--num-processes", str(count),
            "--process-id", str(index)]


def check_flags(train_flags: list[str]) -> list[str]:
    flags = train_flags[1:] if train_flags[:1] == ["--"] else list(train_flags)
    for flag in flags:
        if flag.split("=")[0] in RESERVED_FLAGS:
            raise ConfigError(f"{flag.split('=')[0]}: set by `cvae launch` for each process; "
                              f"leave it out of the train flags")
    return flags


def _prepare_child() -> None:
    """In the child, before exec: SIGINT/SIGTERM wait for its handler, and SIGTERM comes when
    the launcher dies (Linux), so no process outlives it."""
    startup_signals.block_in_child()
    if sys.platform == "linux":
        _die_with_parent()


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the launcher's own handlers still apply
        pass


def describe_exit(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def exit_status(code: int) -> int:
    """A child's return code as a shell exit status (128 + N for a signal, as shells report)."""
    return 128 - code if code < 0 else code


class Launcher:
    """Starts and watches the processes; `run()` returns the exit status for the shell."""

    def __init__(self, count: int, train_flags: list[str], *, grace: float = 10.0,
                 host: str = "127.0.0.1"):
        self.count, self.grace = count, grace
        self.flags = check_flags(train_flags)
        self.address = f"{host}:{free_port(host)}"
        self.processes: list[subprocess.Popen] = []
        self.signals_received = 0
        self.first_signal: int | None = None
        self.polls = 0
        self.failed_at: dict[int, int] = {}  # process index -> the poll that first saw it fail

    def start(self) -> None:
        for index in range(self.count):
            if self.signals_received:  # asked to stop: start no more (see `run`)
                return
            env = dict(os.environ)
            env.setdefault("JAX_LOCAL_DEVICE_IDS", str(index))  # one GPU each (ignored on CPU)
            self.processes.append(subprocess.Popen(
                train_command(self.flags, self.address, count=self.count, index=index), env=env,
                stdin=subprocess.DEVNULL,
                preexec_fn=_prepare_child))

    def forward(self, signum, _frame=None) -> None:
        self.signals_received += 1
        self.first_signal = self.first_signal or signum
        if self.signals_received > 1:  # asked twice: stop waiting for a clean save
            self.send(signal.SIGKILL)
        else:
            self.send(signum)

    def send(self, signum: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signum)

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self.forward) for sig in (signal.SIGINT,
                                                                     signal.SIGTERM)}
        try:
            self.start()
            if len(self.processes) < self.count:
                return self.stopped_while_starting()
            return self.watch()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.send(signal.SIGKILL)  # nothing outlives the launcher, whatever happened
            for process in self.processes:
                process.wait()

    def stopped_while_starting(self) -> int:
        """A signal came before every process was started: the ones started cannot have
        joined the group (it needs all of them), so nothing of theirs is to save."""
        self.send(signal.SIGKILL)
        print(f"cvae launch: interrupted by {signal.Signals(self.first_signal).name} while "
              f"starting processes ({len(self.processes)} of {self.count} started, stopped "
              f"before joining); nothing trained, nothing to save",
              file=sys.stderr, flush=True)
        return startup_signals.EXIT_INTERRUPTED

    def failure(self) -> tuple[int, int] | None:
        """(index, return code) of the process whose failure caused the others', if any.

        Processes that stopped because a peer failed say so with EXIT_PEER_FAILED; the rest
        are ranked by the poll that first saw them fail, so a survivor that JAX's coordination
        service stops (SIGABRT) after a peer was killed is not reported in the peer's place.
        """
        return min(((i, self.processes[i].returncode) for i in self.failed_at),
                   key=lambda f: (f[1] == EXIT_PEER_FAILED, self.failed_at[f[0]], f[0]),
                   default=None)

    def poll(self) -> bool:
        """Whether any process still runs; notes the poll at which each failure was first seen."""
        self.polls += 1
        running = False
        for index, process in enumerate(self.processes):
            code = process.poll()
            running |= code is None
            if code not in (None, 0):
                self.failed_at.setdefault(index, self.polls)
        return running

    def watch(self) -> int:
        deadline = None
        while self.poll():
            if deadline is None and self.failure() is not None:
                self.send(signal.SIGTERM)
                deadline = time.monotonic() + self.grace
            elif deadline is not None and time.monotonic() > deadline:
                self.send(signal.SIGKILL)
            time.sleep(POLL_SECONDS)
        failed = self.failure()
        if failed is None:
            return 0
        index, code = failed
        print(f"cvae launch: process {index} of {self.count} failed ({describe_exit(code)}); "
              f"stopped the others", file=sys.stderr)
        return exit_status(code)


def launch(count: int, train_flags: list[str], grace: float = 10.0) -> int:
    return Launcher(count, train_flags, grace=grace).run()
