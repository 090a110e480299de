"""`cvae serve`: N worker processes on one port under gunicorn, each an uvicorn event loop.

Synopsis:

    serve("checkpoints", port=8000, workers=2)       # what `cvae serve --workers 2` runs

Why gunicorn with uvicorn workers (measured, see docs/service-workers.md): gunicorn's arbiter
holds the listening socket, forks the workers, replaces one that dies (and one that stops
answering its heartbeat), drains them on SIGTERM within `graceful_timeout` and exits 0, and
calls a hook when a worker exits, which the Prometheus multiprocess mode needs. Each worker is
uvicorn on uvloop with the httptools parser, the fastest HTTP path measured here. A worker
loads and compiles the model in its lifespan before it accepts a connection; until then the
other workers, or the kernel's listen backlog, hold the connections.

The master process never imports JAX: workers are forked, and XLA's threads do not survive a
fork. The app is built in each worker by `app_factory`.

Slow or abandoned clients cost a connection for a bounded time only (`BoundedHttpToolsProtocol`).
A clean stop logs no error (`OwnedSocketsWorker`); a worker stopped while its lifespan still
loads and compiles leaves at once with one line (`StartingServer`), and `log_format="json"`
makes gunicorn's and uvicorn's lines JSON objects like the service's own (`JsonLinesLogger`,
service/logs.py).
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import typing
from typing import Callable

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.glogging import Logger as GunicornLogger
from uvicorn import Server
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn_worker import UvicornWorker

from service.logs import JsonFormatter

log = logging.getLogger(__name__)

# A worker's lifespan loads and compiles the model (seconds; longer on a busy machine) before its
# first heartbeat, so gunicorn must not take a slow start for a hang.
WORKER_TIMEOUT_S = 120
GRACEFUL_TIMEOUT_S = 30
# prometheus-client's switch to multiprocess mode. It is read when prometheus_client is first
# imported, so this module must not import it (nor service.metrics) before setting it.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the two time limits uvicorn lacks:

    - `read_timeout`: a whole request (head and any body) must arrive within this many seconds
      of the connection opening or of the previous response ending. uvicorn only times idle
      keep-alive connections, and restarts that timer at every byte, so half a request head, or
      one trickled a byte at a time, would hold the connection for ever.
    - `write_timeout`: a client that stops reading while a response is unsent (the transport's
      buffer above its high-water mark) is cut off after this many seconds. Without it the
      response stays buffered, and the socket open, for as long as the client likes.

    It also marks every unanswered request of a lost connection as disconnected. uvicorn marks
    only the newest one, so with pipelined requests an older one still being answered would
    write to the closed transport, which uvloop refuses with a RuntimeError.

    uvicorn takes a protocol class, not options, so `worker_class` makes a subclass with the
    limits set. It relies on uvicorn's parser callbacks, hence uvicorn's upper bound in
    pyproject.toml.
    """

    read_timeout: float = 10.0
    write_timeout: float = 30.0

    def connection_made(self, transport) -> None:
        self._read_timer = self._write_timer = None
        self._requests_in = self._responses_out = 0
        self._unanswered = collections.deque()  # request cycles, oldest first
        super().connection_made(transport)
        self._await_request()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._unanswered.append(self.cycle)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._requests_in += 1
        self._read_timer = _cancel(self._read_timer)

    def on_response_complete(self) -> None:
        if self._unanswered:
            self._unanswered.popleft()
        super().on_response_complete()
        self._responses_out += 1
        if not self.transport.is_closing() and self._requests_in == self._responses_out:
            self._await_request()  # the next request's clock starts now

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout, self._write_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._write_timer = _cancel(self._write_timer)

    def connection_lost(self, exc: Exception | None) -> None:
        self._read_timer = _cancel(self._read_timer)
        self._write_timer = _cancel(self._write_timer)
        self._disconnect_all()
        super().connection_lost(exc)

    def _disconnect_all(self) -> None:
        for cycle in self._unanswered:
            cycle.disconnected = True

    def _await_request(self) -> None:
        _cancel(self._read_timer)
        self._read_timer = self.loop.call_later(self.read_timeout, self._read_timed_out)

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self._requests_in == self._responses_out and not self.transport.is_closing():
            log.info("closing a connection from %s: no complete request within %g s",
                     self.client, self.read_timeout)
            self.transport.close()

    def _write_timed_out(self) -> None:
        self._write_timer = None
        log.info("dropping a connection to %s: it read nothing for %g s", self.client,
                 self.write_timeout)
        self._disconnect_all()
        self.transport.abort()  # close() would wait for the buffer to drain


def _cancel(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()


class StartingServer(Server):
    """uvicorn's server, except that SIGTERM/SIGINT while the lifespan still loads and compiles
    the model (nothing listens yet, nothing was served) ends the worker at once, with one line
    and exit 0. uvicorn would first finish the start-up, which can take minutes, and gunicorn's
    master waits `graceful_timeout` for it, then kills it."""

    def handle_exit(self, sig, frame) -> None:
        if self.starting():
            leave_while_starting(sig)
        super().handle_exit(sig, frame)

    def starting(self) -> bool:
        return not self.started and not getattr(self, "servers", None)


def leave_while_starting(signum: int) -> typing.NoReturn:
    log.info("worker %d: interrupted by %s while loading the model; leaving at once, nothing "
             "was served", os.getpid(), signal.Signals(signum).name)
    logging.shutdown()  # flushed: os._exit does not wait for the compile threads to end
    os._exit(0)


class OwnedSocketsWorker(UvicornWorker):
    """uvicorn-worker's worker, handing uvicorn the listening sockets themselves.

    The event loop's server owns a socket it is given (asyncio's contract) and closes its
    descriptor on shutdown. uvloop then detaches a `socket.socket`, but calls `close()` on any
    other object, and uvicorn-worker passes gunicorn's wrappers (`gunicorn.sock.TCPSocket`),
    which answer that second close of a closed descriptor by logging "Error while closing
    socket [Errno 9] Bad file descriptor" on every clean shutdown. The wrappers keep the same
    socket objects, which are left detached, so nothing closes a descriptor twice.
    """

    server: StartingServer | None = None

    def run(self) -> None:
        self.sockets = [getattr(listener, "sock", listener) for listener in self.sockets]
        super().run()

    async def _serve(self) -> None:  # uvicorn-worker's, with a `StartingServer`
        self.config.app = self.wsgi
        self.server = StartingServer(config=self.config)
        self._install_sigquit_handler()
        await self.server.serve(sockets=self.sockets)
        if not self.server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)

    def handle_exit(self, sig, frame) -> None:  # SIGQUIT: the master's quick stop (SIGINT)
        if self.server is not None and self.server.starting():
            leave_while_starting(sig)
        super().handle_exit(sig, frame)


def worker_class(read_timeout: float, write_timeout: float) -> type[UvicornWorker]:
    """An uvicorn worker on uvloop + httptools with the client time limits set."""
    protocol = type("BoundedHttpToolsProtocol", (BoundedHttpToolsProtocol,),
                    {"read_timeout": read_timeout, "write_timeout": write_timeout})
    return type("CvaeWorker", (OwnedSocketsWorker,),
                {"CONFIG_KWARGS": {"loop": "uvloop", "http": protocol}})


class JsonLinesLogger(GunicornLogger):
    """gunicorn's logger (its own lines, and uvicorn's, which use its handlers) writing one JSON
    object per line: `cvae serve --log-format json` (service/logs.py)."""

    def setup(self, cfg) -> None:
        super().setup(cfg)
        for log in (self.error_log, self.access_log):
            for handler in log.handlers:
                handler.setFormatter(JsonFormatter())


def resolve_workers(workers: int | str) -> int:
    """`auto` = the cores this process may use."""
    if workers == "auto":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return int(workers)


class _Gunicorn(BaseApplication):
    """gunicorn's documented embedding API: settings from a dict, the app from a factory."""

    def __init__(self, app_factory: Callable, settings: dict):
        self.app_factory, self.settings = app_factory, settings
        super().__init__()

    def load_config(self) -> None:
        for name, value in self.settings.items():
            self.cfg.set(name, value)

    def load(self):
        return self.app_factory()  # in the worker, after the fork


def _worker_exited(_arbiter, worker) -> None:
    """A worker's live gauges leave the multiprocess directory with it."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def serve(app_factory: Callable, host: str = "127.0.0.1", port: int = 8000, *,
          workers: int | str = 1, read_timeout: float = 10.0, write_timeout: float = 30.0,
          keep_alive: int = 5, graceful_timeout: float = GRACEFUL_TIMEOUT_S,
          access_log: bool = True, log_level: str = "info", log_format: str = "text") -> None:
    """Run `app_factory()` in `workers` processes on host:port until SIGTERM or SIGINT.

    log_format: `text` (gunicorn's lines) or `json` (one JSON object per line, service/logs.py).

    Sets up the Prometheus multiprocess directory (a fresh temporary one, unless
    PROMETHEUS_MULTIPROC_DIR names one, which is emptied) before any worker starts.
    """
    own_dir = MULTIPROC_ENV not in os.environ
    if own_dir:
        os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="cvae-metrics-")
    directory = os.environ[MULTIPROC_ENV]
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        if name.endswith(".db"):
            os.remove(os.path.join(directory, name))
    settings = {
        "bind": [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"],
        "workers": resolve_workers(workers),
        "worker_class": worker_class(read_timeout, write_timeout),
        "timeout": WORKER_TIMEOUT_S,
        "graceful_timeout": graceful_timeout,
        "keepalive": keep_alive,
        "loglevel": log_level,
        "accesslog": "-" if access_log else None,
        "errorlog": "-",
        "child_exit": _worker_exited,
        "control_socket_disable": True,  # gunicorn's default path is shared by every server
        "proc_name": "cvae-serve",
    }
    if log_format == "json":
        settings["logger_class"] = JsonLinesLogger
    master = os.getpid()
    try:
        _Gunicorn(app_factory, settings).run()
    finally:
        # Forked workers leave through here too (gunicorn ends them with sys.exit).
        if own_dir and os.getpid() == master:
            shutil.rmtree(directory, ignore_errors=True)


def lazy_app(target: str, *args, **kwargs) -> Callable:
    """A factory for `module:function(*args, **kwargs)` that imports the module only when
    called, i.e. in the worker, so the master never loads JAX."""
    def build():
        module, _, name = target.partition(":")
        return getattr(importlib.import_module(module), name)(*args, **kwargs)
    return build
