"""SIGTERM/SIGINT at moments of start-up of `cvae train`, `cvae serve` and `cvae launch`: one clear
line, exit 0, and nothing half-written (cvae/training/signals.py).

Each moment is one a test can see, none an env-var hook: the process's handler in place (its
caught-signal mask in /proc/PID/status), the checkpoint folder made (the data are loaded), the
previous run set aside by `--fresh` (the model initialised, the loop about to start), a worker's
"Waiting for application startup." (its lifespan loading and compiling the model), the
launcher's processes running. Every process is bounded in time and killed with its group at
the end; servers listen on 127.0.0.1 only.

Cost, measured with `CVAE_CPU_PROFILE` on the 2-core machine: 38 CPU-seconds, 58 s of wall
time alone; 16 of them are the two `cvae launch` processes, which start up in full before they
agree to stop (a multi-process run only notes a signal during start-up), 14 the `--fresh` test
(of which ~5 the session's `trained_run`, shared with other files), the rest JAX loading.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servers import children, free_port
from cvae.training import signals as startup_signals
from cvae.training.checkpoints import load_checkpoint

pytestmark = pytest.mark.slow  # `make test-slow`, not `make test` (docs/development.md)

LIMIT_S = 120  # each process must have stopped by then, on a loaded machine
TRAIN = ["--preset", "test", "--no-progress"]


def caught(pid: int, signum: int) -> bool:
    """Whether `pid` has a handler for `signum` (its SigCgt mask, Linux)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt"))
    return bool(int(mask, 16) >> (signum - 1) & 1)


def wait_for(condition, process: subprocess.Popen, what: str, timeout: float = LIMIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            pytest.fail(f"exited ({process.returncode}) before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout} s")
        time.sleep(0.005)


class Started:
    """A `cvae` process in its own session, its output in a file; killed with its group after."""

    def __init__(self, argv: list[str], log: Path):
        self.log_path = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "cvae.cli", *argv],
                                            stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self) -> int:
        try:
            return self.process.wait(LIMIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {LIMIT_S} s after the signal:\n{self.log()[-3000:]}")

    def lines(self, text: str) -> list[str]:
        return [line for line in self.log().splitlines() if text in line]

    def kill_group(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


@pytest.fixture
def started(tmp_path):
    made = []

    def start(*argv: str) -> Started:
        made.append(Started(list(argv), tmp_path / f"log-{len(made)}.txt"))
        return made[-1]
    yield start
    for one in made:
        one.kill_group()


def test_start_up_handler_stops_notes_and_defers():
    """In-process: STOP_NOW raises at once, or after a `deferred()` block; NOTE only notes, for
    the training loop to take over; the previous handlers come back."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        startup_signals.install(startup_signals.STOP_NOW)
        with pytest.raises(startup_signals.Interrupted, match="interrupted by SIGTERM"):
            with startup_signals.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.01)
                reached_the_end_of_the_block = True
        assert reached_the_end_of_the_block
        with pytest.raises(startup_signals.Interrupted, match="SIGINT"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        startup_signals.note_only()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        assert startup_signals.take_pending() == signal.SIGTERM
        assert startup_signals.take_pending() is None
    finally:
        startup_signals.uninstall()
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_signal_that_python_drops_is_still_noted_and_prints_nothing(capfd):
    """A signal landing in a garbage-collection callback raises there, and Python drops
    exceptions from those: noted, the training loop still stops on it, with no traceback."""
    def callback(phase, _info):
        if phase == "start":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # the handler runs here, inside the callback

    try:
        startup_signals.install(startup_signals.STOP_NOW)
        gc.callbacks.append(callback)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(callback)
        assert startup_signals.take_pending() == signal.SIGTERM
    finally:
        startup_signals.uninstall()
    assert capfd.readouterr().err == ""


def assert_one_start_up_line(process: Started, command: str, signum: int) -> None:
    name = signal.Signals(signum).name
    ours = process.lines(f"cvae {command}: interrupted by {name}")
    if command == "train" and not ours:  # it landed where Python drops exceptions: the loop
        ours = process.lines(f"interrupted by {name} during start-up, before any step")
    assert len(ours) == 1, process.log()[-3000:]
    assert "Traceback" not in process.log(), process.log()[-3000:]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_train_stopped_while_importing_jax(data_dir, tmp_path, started, signum):
    """The moment its handler is in place: the parser is still importing JAX."""
    checkpoints = tmp_path / "run"
    train = started("train", "--data-dir", str(data_dir), "--checkpoint-dir", str(checkpoints),
                    *TRAIN)
    wait_for(lambda: caught(train.pid, signal.SIGTERM), train.process, "handler")
    train.process.send_signal(signum)
    assert train.wait() == 0, train.log()[-3000:]
    assert_one_start_up_line(train, "train", signum)
    assert "during start-up" in train.log()
    assert not checkpoints.exists()  # made only once the data are loaded


def test_train_stopped_once_the_data_are_loaded(data_dir, tmp_path, started):
    """The checkpoint folder appears after the data are loaded, while the model is initialised
    and compiled: nothing is left in it but what a fresh run starts from."""
    checkpoints = tmp_path / "run"
    train = started("train", "--data-dir", str(data_dir), "--checkpoint-dir", str(checkpoints),
                    *TRAIN)
    wait_for(checkpoints.exists, train.process, "checkpoint folder")
    train.process.send_signal(signal.SIGTERM)
    assert train.wait() == 0, train.log()[-3000:]
    assert_one_start_up_line(train, "train", signal.SIGTERM)
    assert not [p for p in checkpoints.iterdir() if p.name[0].isdigit() or "write-test" in p.name]


def test_train_fresh_stopped_as_it_sets_the_previous_run_aside(data_dir, trained_run, tmp_path,
                                                               started):
    """`--fresh` moves the previous run aside after the model is initialised, just before the
    loop's own handler takes over: the signal lands in start-up (one start-up line) or in the
    loop (it stops before or after its first chunk and saves), and the moves are never cut in
    half. Either way exit 0, the previous run whole in its archive, and what is left resumable."""
    checkpoints = trained_run.copy_to(tmp_path / "run")
    # 50 epochs: a signal sent late by a busy test process still lands before the run's end
    # (one epoch is a few seconds; a signal during the last chunk or the final save is only
    # noted, and the run ends as it would have)
    train = started("train", "--data-dir", str(data_dir), "--checkpoint-dir", str(checkpoints),
                    "--fresh", *TRAIN, "--epochs", "50")
    wait_for(lambda: any(checkpoints.glob("replaced-*")), train.process, "set-aside")
    train.process.send_signal(signal.SIGTERM)
    assert train.wait() == 0, train.log()[-3000:]
    lines = (train.lines("cvae train: interrupted by SIGTERM during start-up")
             + train.lines("stopped at step"))
    assert len(lines) == 1 and "interrupted by SIGTERM" in lines[0], train.log()[-3000:]
    (archive,) = checkpoints.glob("replaced-*")
    assert sorted(int(p.name) for p in archive.iterdir() if p.name.isdigit()) == \
        list(trained_run.steps)
    left = [p for p in checkpoints.iterdir() if p.name.isdigit()]
    assert not list(checkpoints.glob("*orbax-checkpoint-tmp*"))
    if left:  # stopped in the loop after its first chunk: that step was saved whole
        assert load_checkpoint(checkpoints).step == max(int(p.name) for p in left)


def test_serve_stopped_before_gunicorn_runs(trained_run, tmp_path, started):
    """The master's handler is ours and gunicorn's are not yet (no SIGHUP handler): it is still
    importing gunicorn and checking the checkpoint."""
    serve = started("serve", "--checkpoint-dir", str(trained_run.directory), "--port",
                    str(free_port()))
    wait_for(lambda: caught(serve.pid, signal.SIGTERM), serve.process, "handler")
    if caught(serve.pid, signal.SIGHUP):
        pytest.skip("gunicorn was already running when the handler was seen")
    serve.process.send_signal(signal.SIGTERM)
    assert serve.wait() == 0, serve.log()[-3000:]
    assert_one_start_up_line(serve, "serve", signal.SIGTERM)
    assert "Starting gunicorn" not in serve.log()


@pytest.mark.parametrize("to_group", [False, True], ids=["sigterm-to-master", "ctrl-c"])
def test_serve_stopped_while_the_worker_loads_the_model(trained_run, tmp_path, started,
                                                        to_group):
    """SIGTERM to the master (what Kubernetes sends), or SIGINT to the whole group (Ctrl-C),
    while the worker's lifespan loads and compiles: the worker leaves at once with one line
    instead of finishing the compile, and the master exits 0."""
    serve = started("serve", "--checkpoint-dir", str(trained_run.directory), "--port",
                    str(free_port()))
    wait_for(lambda: "Waiting for application startup." in serve.log(), serve.process,
             "lifespan")
    worker = children(serve.pid)
    if to_group:
        os.killpg(serve.pid, signal.SIGINT)
    else:
        serve.process.send_signal(signal.SIGTERM)
    assert serve.wait() == 0, serve.log()[-3000:]
    name = "SIGINT" if to_group else "SIGTERM"
    if not serve.lines("Application startup complete"):  # else it started before the signal
        assert len(serve.lines(f"interrupted by {name} while loading the model")) == 1, \
            serve.log()[-3000:]
    assert serve.lines("Shutting down: Master")
    assert "Traceback" not in serve.log() and "[ERROR]" not in serve.log(), serve.log()[-3000:]
    assert worker and not Path(f"/proc/{worker[0]}").exists()


def test_launch_stopped_while_its_processes_start(data_dir, tmp_path, started):
    """SIGTERM to the launcher as soon as its two processes exist, before they have set their
    handlers: they hold it until they have (started with it blocked), note it, start up in full,
    agree to stop before the first chunk, and every one exits 0: no step, nothing saved."""
    checkpoints = tmp_path / "run"
    launch = started("launch", "--local-processes", "2", "--", "--data-dir", str(data_dir),
                     "--checkpoint-dir", str(checkpoints), *TRAIN)
    wait_for(lambda: len(children(launch.pid)) == 2, launch.process, "processes")
    launch.process.send_signal(signal.SIGTERM)
    assert launch.wait() == 0, launch.log()[-3000:]
    lines = launch.lines("stopped at step 0: interrupted by SIGTERM")
    assert len(lines) == 1, launch.log()[-3000:]  # process 0's
    assert "failed" not in launch.log() and "Traceback" not in launch.log()
    assert not [p for p in checkpoints.iterdir() if p.name.isdigit()]


def test_launch_stopped_before_its_processes_start(data_dir, tmp_path, started):
    """The launcher's handler in place, no process yet: one line, exit 0, no process left."""
    launch = started("launch", "--local-processes", "2", "--", "--data-dir", str(data_dir),
                     "--checkpoint-dir", str(tmp_path / "run"), *TRAIN)
    wait_for(lambda: caught(launch.pid, signal.SIGTERM), launch.process, "handler")
    launch.process.send_signal(signal.SIGTERM)
    assert launch.wait() == 0, launch.log()[-3000:]
    assert_one_start_up_line(launch, "launch", signal.SIGTERM)
    assert not children(launch.pid)
