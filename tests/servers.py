"""Real `cvae serve` subprocesses on free loopback ports, for the end-to-end service tests.

    with cvae_server(checkpoint_dir, tmp_path / "server.log") as server:
        httpx.get(f"{server.url}/sample", params={"digit": 7})   # server.pid: its process

The process plumbing (start, wait for /readyz, stop) is bench/bench_service.py's, shared with
the load benchmark and `python -m bench.soak`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from bench.bench_service import ServerProcess, cvae_serve_command, free_port, server_process

__all__ = ["ServerProcess", "cvae_serve", "cvae_server", "free_port"]


@contextlib.contextmanager
def cvae_server(checkpoint_dir: Path, log_path: Path, timeout: float = 120.0, *extra: str):
    """Yields a `ServerProcess` running `cvae serve` once /readyz answers 200; `extra` are
    more `cvae serve` arguments."""
    port = free_port()
    with server_process(cvae_serve_command(checkpoint_dir, port, *extra), port, log_path,
                        timeout) as server:
        yield server


@contextlib.contextmanager
def cvae_serve(checkpoint_dir: Path, log_path: Path, timeout: float = 120.0):
    """Yields the base URL of a `cvae serve` subprocess once /readyz answers 200."""
    with cvae_server(checkpoint_dir, log_path, timeout) as server:
        yield server.url
