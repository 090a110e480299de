"""Real `cvae serve` processes on free loopback ports, for the service's end-to-end tests.

    with cvae_server(checkpoint_dir, tmp_path / "server.log", "--workers", "2") as server:
        httpx.get(f"{server.url}/sample", params={"digit": 7})
        server.worker_pids()          # the gunicorn workers, children of server.pid

    with uvicorn_in_thread(create_app(checkpoint_dir)) as url:   # one in-process worker
        httpx.get(f"{url}/sample", params={"label": "dog"})

The server is stopped (SIGTERM, then SIGKILL after 30 s) when the block ends, also on failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def children(pid: int) -> list[int]:
    """Direct child processes of `pid` (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listing:
            return [int(child) for child in listing.read().split()]
    except OSError:
        return []


@dataclasses.dataclass(frozen=True)
class ServerProcess:
    """A `cvae serve` master process listening on 127.0.0.1:`port`."""

    process: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def worker_pids(self) -> list[int]:
        return children(self.pid)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def ready(url: str) -> dict | None:
    """/readyz's JSON when it answers 200, else None."""
    import json

    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=5) as reply:
            return json.load(reply) if reply.status == 200 else None
    except OSError:
        return None


def wait_for_workers(server: ServerProcess, count: int, timeout: float = 120.0) -> set[int]:
    """Until `count` workers are children of the master and each has answered /readyz (a new
    connection per probe lands on whichever worker accepts it); returns their pids."""
    deadline = time.monotonic() + timeout
    answered: set[int] = set()
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n"
                               f"{server.log()[-4000:]}")
        live = set(server.worker_pids())
        if (status := ready(server.url)) is not None:
            answered.add(status["pid"])
        answered &= live
        if len(live) == count and answered == live:
            return answered
        time.sleep(0.05)
    raise RuntimeError(f"{count} ready workers not seen within {timeout} s (answered "
                       f"{answered}):\n{server.log()[-4000:]}")


def cvae_serve_command(checkpoint_dir: str | Path, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "cvae.cli", "serve", "--checkpoint-dir", str(checkpoint_dir),
            "--host", "127.0.0.1", "--port", str(port), *extra]


def stop(process: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM, then SIGKILL (the whole process group) if it has not exited in `timeout` s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


@contextlib.contextmanager
def cvae_server(checkpoint_dir: str | Path, log_path: Path, *extra: str, workers: int = 1,
                timeout: float = 120.0):
    """Yields a `ServerProcess` running `cvae serve --workers N` once every worker is ready;
    `extra` are more `cvae serve` arguments."""
    port = free_port()
    command = cvae_serve_command(checkpoint_dir, port, "--workers", str(workers), *extra)
    with open(log_path, "wb") as log:
        # A process group of its own, so a stuck server and its workers can be killed together.
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    server = ServerProcess(process, port, log_path)
    try:
        wait_for_workers(server, workers, timeout)
        yield server
    finally:
        stop(process)


@contextlib.contextmanager
def uvicorn_in_thread(app):
    """A real uvicorn serving `app` on a free loopback port, in a thread of this process (so
    the app sees this process's state, a dataset registered by a test included); yields its
    URL and stops it when the block ends."""
    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
