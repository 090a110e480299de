"""`cvae launch`'s watcher with real child processes: which failure it reports, and how."""

import subprocess
import sys

import pytest

from cvae.training.launch import EXIT_PEER_FAILED, Launcher

# Each child: ignore SIGTERM (like `cvae train`, which finishes its chunk first, it outlives the
# launcher's SIGTERM), say it is ready, wait for the go, sleep, then end in the given way.
ABORT, KILL = "os.abort()", "os.kill(os.getpid(), signal.SIGKILL)"


def child(delay: float, ending: str) -> list[str]:
    return [sys.executable, "-c", "import os, signal, sys, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
            f"sys.stdin.readline(); time.sleep({delay}); {ending}"]


class Scripted(Launcher):
    """The launcher's own watching, over scripted children instead of `cvae train`.

    The children's delays count from one go, given once all of them ignore SIGTERM, so the
    order of their endings does not hang on how fast a loaded machine starts Python."""

    def __init__(self, commands: list[list[str]], *, ended_before_watching: bool = False):
        super().__init__(len(commands), [], grace=5.0)
        self.commands = commands
        self.ended_before_watching = ended_before_watching

    def start(self) -> None:
        self.processes = [subprocess.Popen(command, stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, text=True)
                          for command in self.commands]
        for process in self.processes:
            assert process.stdout.readline() == "ready\n"
            process.stdout.close()
        for process in self.processes:
            process.stdin.write("go\n")
            process.stdin.close()
        if self.ended_before_watching:  # so the first poll sees every failure at once
            for process in self.processes:
                process.wait()


@pytest.mark.parametrize("commands, status, line", [
    # JAX's coordination service aborts the survivor after the killed peer: the peer is named.
    ([child(1.0, ABORT), child(0.0, KILL)], 137, "process 1 of 2 failed (killed by SIGKILL)"),
    # A process that says its peer failed is never the one named, even when it exits first.
    ([child(0.5, f"sys.exit({EXIT_PEER_FAILED})"), child(1.5, "sys.exit(1)")], 1,
     "process 1 of 2 failed (exit code 1)"),
])
def test_the_launcher_names_the_process_that_failed_first(commands, status, line, capsys):
    assert Scripted(commands).run() == status
    assert capsys.readouterr().err == f"cvae launch: {line}; stopped the others\n"


def test_failures_seen_in_the_same_poll_name_the_lower_index(capsys):
    """Both children have ended before the first poll (on a loaded machine two children that
    exit at once can still end a poll apart), so that poll sees both failures."""
    assert EXIT_PEER_FAILED not in (5, 3)  # which the ranking would put last
    commands = [child(0.0, "sys.exit(5)"), child(0.0, "sys.exit(3)")]
    assert Scripted(commands, ended_before_watching=True).run() == 5
    assert capsys.readouterr().err == (
        "cvae launch: process 0 of 2 failed (exit code 5); stopped the others\n")


def test_the_launcher_exits_0_when_every_process_does(capsys):
    assert Scripted([child(0.0, "sys.exit(0)"), child(0.2, "sys.exit(0)")]).run() == 0
    assert capsys.readouterr().err == ""
