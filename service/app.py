"""The FastAPI sampling service: `GET /sample` draws PNG digit grids from the latest checkpoint;
`POST /transfer` writes an uploaded digit's hand as every digit; `GET /interpolate` walks the
latent space; `POST /classify` reads an uploaded digit (q(y|x) for a few-label model, Bayes'
rule on p(x|y) for any other).

Synopsis:

    app = create_app("checkpoints")           # what each `cvae serve` worker runs
    with TestClient(app) as client:           # the lifespan loads and compiles the model
        png = client.get("/sample", params={"digit": 7, "seed": 1}).content

`create_app` only assembles: the lifespan, the state the routes share, the middleware and one
router per job (service/routes/: sampling, transfer, classify, operations). The lifespan loads
the newest readable checkpoint (service/checkpoints.py) and compiles the decode sampler before it
lets requests in; a watcher thread then swaps in newer steps. Routes get the model being served from
the `served_model` dependency (503 until one is loaded) and decode through the `Batcher`
(service/batching.py), which batches concurrent requests on the event loop
(service/dependencies.py). The service never writes to the checkpoint directory. The HTTP
contract is docs/design.md, "HTTP service".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import signal
import threading
import time
from pathlib import Path

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError

from cvae.export.compiled import use_cache
from cvae.sampling.compilation_cache import counted
from service.batching import Batcher
from service.checkpoints import CheckpointWatcher
from service.direct import ServiceApp
from service.logs import RequestIdMiddleware
from service.metrics import Metrics, MetricsMiddleware
from service.params import validation_error_handler
from service.routes import api_docs, browser, classify, operations, sampling, transfer

log = logging.getLogger(__name__)

ROUTERS = (sampling.router, transfer.router, classify.router, operations.router,
           api_docs.router, browser.router)


def create_app(checkpoint_dir: str | Path, *, poll_interval: float = 2.0,
               max_batch_rows: int = 4096, max_pending_rows: int = 40960,
               request_timeout: float = 30.0, cache_max_age: int = 600,
               request_ids: bool = False, truncation: float | None = None,
               step: int | str = "latest", compilation_cache: str | None = None) -> FastAPI:
    """The service for `checkpoint_dir` (see the module docstring).

    max_batch_rows: latent rows per decode call; max_pending_rows: rows waiting or decoding
    before 503; request_timeout: seconds a decode may take before 503; cache_max_age: seconds
    browsers and CDNs may keep a seeded picture before revalidating it; request_ids: give each
    request an id, returned as X-Request-ID and logged with its lines (service/logs.py);
    truncation: draw every step's samples at this quantile instead of its own (`cvae serve
    --truncation`); step: which step to serve, a number, "best" or "latest" (`cvae serve
    --step`, service/checkpoints.py); compilation_cache: the directory where compiled programs
    are kept between starts (`cvae serve --compilation-cache`), or "off"; None leaves JAX's
    settings as they are.
    """
    metrics = Metrics()
    lifespan = functools.partial(serve_checkpoints, checkpoint_dir=checkpoint_dir,
                                 poll_interval=poll_interval, max_batch_rows=max_batch_rows,
                                 max_pending_rows=max_pending_rows,
                                 request_timeout=request_timeout, truncation=truncation,
                                 step=step, compilation_cache=compilation_cache)
    app = ServiceApp(title="cvae sampling service", lifespan=lifespan,
                     description="Class-conditioned VAE digits as PNG grids. See docs/design.md.",
                     # /docs and /redoc from local files (service/routes/api_docs.py), not a CDN
                     docs_url=None, redoc_url=None,
                     # The service reports through Prometheus (/metrics). FastAPI's OpenTelemetry
                     # hooks would look up the global providers on every request: 4% of a
                     # worker's Python time under load, for nothing.
                     telemetry={"tracing": False, "metrics": False, "logs": False})
    app.state.metrics = metrics
    app.state.cache_control = f"public, max-age={cache_max_age}"
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    if request_ids:
        app.add_middleware(RequestIdMiddleware)  # outermost: its id is set before anything logs
    for router in ROUTERS:
        app.include_router(router)
    app.answer_directly(sampling.SAMPLE_ROUTE)  # the busiest route, past the router
    return app


@contextlib.asynccontextmanager
async def serve_checkpoints(app: FastAPI, *, checkpoint_dir: str | Path, poll_interval: float,
                            max_batch_rows: int, max_pending_rows: int, request_timeout: float,
                            truncation: float | None, step: int | str,
                            compilation_cache: str | None):
    """The lifespan: load and compile the chosen checkpoint, then serve it (and the ones that
    replace it)."""
    metrics: Metrics = app.state.metrics
    watcher = CheckpointWatcher(checkpoint_dir, poll_interval, on_load=metrics.observe_load,
                                truncation=truncation, step=step)
    await asyncio.to_thread(start_up, watcher, checkpoint_dir, compilation_cache)
    # Everything allocated so far (JAX, the frameworks, the model) is moved out of the garbage
    # collector's reach while serving: a full collection walks every tracked object and held
    # the event loop ~100 ms, which every request in flight waited for (the p99 at concurrency
    # 64, even for a constant PNG). Requests' garbage is collected as before. No collection
    # first: it found about 50 unreachable objects among 200,000 and took 0.12 s of the start.
    gc.freeze()
    # Young collections every 700 allocations visited each request's objects while still alive
    # (~10% of the loop's time at concurrency 64); every 50,000, most have died by refcount.
    thresholds = gc.get_threshold()
    gc.set_threshold(50_000, 20, 20)
    batcher = Batcher(max_batch_rows, max_pending_rows, request_timeout,
                      on_batch=metrics.observe_batch)
    watcher.start()
    app.state.watcher, app.state.batcher = watcher, batcher
    sighup = _install_sighup(watcher)
    try:
        yield
    finally:
        if sighup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        await asyncio.to_thread(watcher.stop)
        await batcher.stop()
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def start_up(watcher: CheckpointWatcher, checkpoint_dir: str | Path,
             compilation_cache: str | None) -> None:
    """Load the model and compile one block size (the watcher's thread checks the other sizes
    next, `finish_checks`, while requests are answered), reading compiled programs from the
    cache where an earlier start, or the export, left them; logs what it took."""
    started = time.perf_counter()
    cache = use_cache(checkpoint_dir, compilation_cache) if compilation_cache else None
    with counted() as programs:
        watcher.refresh(check="first")
    if watcher.current is not None:
        log.info("loaded step %d in %.1f s: %d compiled programs read from %s, %d compiled",
                 watcher.current.step, time.perf_counter() - started, programs.hits,
                 cache or "no cache", programs.misses)


def _install_sighup(watcher: CheckpointWatcher) -> bool:
    """SIGHUP = check the checkpoint directory now (only where the loop owns signals)."""
    if not hasattr(signal, "SIGHUP") or threading.current_thread() is not threading.main_thread():
        return False
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, watcher.wake)
    except (NotImplementedError, RuntimeError, ValueError):
        return False
    return True
