"""The FastAPI sampling service: `GET /sample` draws PNG digit grids from the latest checkpoint.

Synopsis:

    app = create_app("checkpoints")           # what `cvae serve` runs under uvicorn
    with TestClient(app) as client:           # the lifespan loads and compiles the model
        png = client.get("/sample", params={"digit": 7, "seed": 1}).content

The lifespan loads the newest readable checkpoint (falling back past unreadable ones), compiles
the decode sampler from `cvae.sampling` and only then lets requests in. A `CheckpointWatcher`
thread polls the directory (or wakes on SIGHUP) and swaps in newer steps: the served model is
one immutable `Loaded` object behind a reference, so a swap is atomic and a request keeps the
weights it started with. Requests become `Job`s for the `Batcher` (service/batching.py): decode
and PNG encoding run on its threads; the route only awaits a future. The service never writes to
the checkpoint directory. The HTTP contract is DESIGN.md, "HTTP service".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import secrets
import signal
import threading
import time
from pathlib import Path
from typing import Annotated, Any, Literal

import h11
import numpy as np
from fastapi import Depends, FastAPI, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field
from uvicorn.protocols.http.h11_impl import H11Protocol

from cvae.grid import grid_shape, make_grid, png_bytes
from cvae.config import MAX_SEED
from cvae.sampling import (DEFAULT_BLOCK_ROWS, DIGITS, LatentRequest, Sampler, batch_latents,
                           grid_columns, load_sampler)
from service.batching import Batcher, Job, QueueFull, Stopped
from service.metrics import Metrics, MetricsMiddleware

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
MAX_N = 1024
RANDOM_SEED_LIMIT = MAX_SEED + 1  # drawn seeds cover the same range as given ones
MAX_PIXELS = 64_000_000  # one grid at most 64 MP (n=1024, scale 8, one digit is 52 MP)
RETRY_AFTER_BUSY_S = 1

# What each query parameter accepts, as the 422 message words it.
PARAMETER_RULES = {
    "digit": "an integer in 0..9, or omitted for one row per digit",
    "n": f"an integer in 1..{MAX_N}",
    "cols": f"an integer in 1..{MAX_N}",
    "seed": f"an integer in 0..{MAX_SEED}",
    "temperature": "a number with 0 < temperature <= 2",
    "scale": "an integer in 1..8",
    "pad": "an integer in 0..8",
}


# ---- response shapes, for the OpenAPI schema (/docs, and what fuzzing checks replies against) --


class ParameterProblem(BaseModel):
    loc: list[str | int] = Field(description='where, e.g. ["query", "digit"]')
    msg: str
    type: str
    input: Any = None


class BadParameters(BaseModel):
    """422: every bad parameter, named with its allowed range."""

    message: str = Field(description="one sentence per bad parameter: name, allowed range, "
                                     "value given")
    detail: list[ParameterProblem]


class Unavailable(BaseModel):
    """503: not ready (where it looked, and `make train`), or busy / too slow: retry."""

    detail: str


class NotReady(Unavailable):
    status: Literal["not ready"]
    checkpoint_dir: str


class Ready(BaseModel):
    status: Literal["ready"]
    step: int
    checkpoint_dir: str
    config: dict[str, Any]
    note: str | None = Field(description="e.g. newer checkpoints that could not be read")
    loaded_at: float = Field(description="Unix time the step was loaded")


RETRY_AFTER_HEADER = {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}}
SAMPLE_RESPONSES = {
    200: {"description": "PNG grid (8-bit grayscale)",
          "content": {"image/png": {"schema": {"type": "string", "format": "binary"}}},
          "headers": {"X-Checkpoint-Step": {"description": "the step whose weights drew it",
                                            "schema": {"type": "integer"}},
                      "X-Seed": {"description": "the seed used, also when drawn at random",
                                 "schema": {"type": "integer"}}}},
    422: {"model": BadParameters, "description": "a parameter is out of range, or the grid "
                                                 "would be too large"},
    503: {"model": Unavailable, "headers": RETRY_AFTER_HEADER,
          "description": "no checkpoint yet, or busy: retry after Retry-After seconds"},
}


@dataclasses.dataclass(frozen=True)
class Loaded:
    """The model being served: replaced as a whole, never mutated."""

    sampler: Sampler
    step: int
    mtime_ns: int  # of the step folder, to notice a step rewritten under the same number
    loaded_at: float


@dataclasses.dataclass(frozen=True)
class SampleParams:
    digit: int | None
    n: int
    cols: int | None
    seed: int | None
    temperature: float
    scale: int
    pad: int


async def sample_params(
    digit: Annotated[int | None, Query(ge=0, le=9, description="0-9; omit: row per digit")] = None,
    n: Annotated[int, Query(ge=1, le=MAX_N, description="samples per digit")] = 16,
    cols: Annotated[int | None, Query(ge=1, le=MAX_N,
                                      description="default ceil(sqrt(n)); n without digit")] = None,
    seed: Annotated[int | None, Query(ge=0, le=MAX_SEED,
                                      description="omit for a random one (see X-Seed)")] = None,
    temperature: Annotated[float, Query(gt=0, le=2, description="z ~ N(0, t^2 I)")] = 1.0,
    scale: Annotated[int, Query(ge=1, le=8, description="integer upscale of each tile")] = 1,
    pad: Annotated[int, Query(ge=0, le=8, description="px around every tile")] = 2,
) -> SampleParams:
    # async: a plain `def` dependency would cost a threadpool hop per request.
    return SampleParams(digit, n, cols, seed, temperature, scale, pad)


# ---- checkpoints ---------------------------------------------------------------------------


def list_steps(directory: Path) -> list[int]:
    """Committed step folders, newest first (Orbax names temporary folders non-numerically)."""
    try:
        return sorted((int(p.name) for p in directory.iterdir()
                       if p.name.isdigit() and p.is_dir()), reverse=True)
    except OSError:  # missing, or vanished while listing
        return []


def _mtime_ns(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def warm_up(sampler: Sampler) -> None:
    """Compile the decode block, and the latent draws of the common batch sizes (n <= 16 with
    up to 64 (seed, digit) pairs), so requests do not pay for compilation."""
    sampler.warm_up()
    for pairs in (1, 10, 20, 40):
        digits = (7,) if pairs == 1 else DIGITS
        requests = [LatentRequest(0, digits, 16, 1.0)] * max(1, pairs // len(digits))
        (z, labels), *_ = batch_latents(requests, sampler.config.latent_dim)
        png_bytes(make_grid(sampler.decode(z, labels), 4))


class CheckpointWatcher:
    """Holds the served `Loaded` model and replaces it when a newer step becomes readable."""

    def __init__(self, directory: str | Path, block_rows: int, metrics: Metrics,
                 poll_interval: float):
        self.directory = Path(directory).absolute()
        self.block_rows, self.metrics, self.poll_interval = block_rows, metrics, poll_interval
        self.current: Loaded | None = None
        self.note: str | None = None  # why not ready, or which newer step was skipped
        self.failed: dict[tuple[int, int], str] = {}  # (step, mtime_ns) -> reason
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._poll, name="cvae-checkpoints", daemon=True)

    def refresh(self) -> None:
        """Load the newest readable step if it is not the one served (poller thread).

        Normally that means a step newer than the served one; when the served step's folder
        vanished or was rewritten (`cvae train --fresh` sets old runs aside), any step will do.
        """
        steps = list_steps(self.directory)
        current = self.current
        unchanged = (current is not None
                     and _mtime_ns(self.directory / str(current.step)) == current.mtime_ns)
        if unchanged:
            candidates = [s for s in steps if s > current.step]
        else:
            candidates = steps
        skipped = []
        for step in candidates:
            reason = self._try_load(step)
            if reason is None:
                break
            skipped.append(f"step {step}: {reason}")
        self._update_note(skipped)

    def _try_load(self, step: int) -> str | None:
        """Loads and swaps in `step`; returns None, or why it could not."""
        key = (step, _mtime_ns(self.directory / str(step)))
        if key[1] is None:
            return "vanished"
        if key in self.failed:
            return self.failed[key]
        try:
            sampler = load_sampler(self.directory, step, block_rows=self.block_rows)
            warm_up(sampler)
        except Exception as error:  # a corrupt or half-deleted step must not stop the service
            reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            self.failed[key] = reason
            self.metrics.checkpoint_loads.labels("failed").inc()
            log.warning("cannot load checkpoint step %d in %s (%s); %s", step, self.directory,
                        reason, f"keeping step {self.current.step}" if self.current
                        else "nothing to serve yet")
            return reason
        self.current = Loaded(sampler, step, key[1], time.time())
        self.metrics.checkpoint_loads.labels("loaded").inc()
        self.metrics.checkpoint_step.set(step)
        log.warning("serving checkpoint step %d from %s", step, self.directory)
        return None

    def _update_note(self, skipped: list[str]) -> None:
        if self.current is None:
            where = (f"no checkpoint in {self.directory}" if not skipped
                     else f"no readable checkpoint in {self.directory} ({'; '.join(skipped)})")
            self.note = (f"{where}: run `make train` (or `cvae train --checkpoint-dir "
                         f"{self.directory}`); the service picks it up when it appears")
        elif skipped:
            self.note = (f"serving step {self.current.step}: newer checkpoint(s) could not be "
                         f"read ({'; '.join(skipped)})")
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
        while True:
            self._wake.wait(self.poll_interval)
            self._wake.clear()
            if self._stopping:
                return
            try:
                self.refresh()
            except Exception:  # never let the poller die
                log.exception("checkpoint poll of %s failed", self.directory)


# ---- responses -----------------------------------------------------------------------------


def encode_png(images: np.ndarray, cols: int, scale: int, pad: int) -> bytes:
    """images f32[R, 28, 28] -> PNG grid bytes (runs on the batcher's encoder threads)."""
    return png_bytes(make_grid(images, cols, pad=pad, scale=scale))


def error(status_code: int, message: str, headers: dict | None = None, **extra) -> JSONResponse:
    return JSONResponse({"detail": message, **extra}, status_code=status_code, headers=headers)


def describe_errors(errors: list[dict]) -> str:
    """One sentence per bad parameter: 'digit: must be an integer in 0..9 (got '10')'."""
    parts = []
    for item in errors:
        loc = item.get("loc") or ()
        name = loc[-1] if loc else "request"
        if name in PARAMETER_RULES:
            parts.append(f"{name}: must be {PARAMETER_RULES[name]} (got {item.get('input')!r})")
        else:
            parts.append(f"{'.'.join(map(str, loc))}: {item.get('msg')}")
    return "; ".join(parts)


async def validation_error_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = jsonable_encoder(exc.errors())
    return JSONResponse({"message": describe_errors(errors), "detail": errors}, status_code=422)


def too_large(params: SampleParams, rows: int, cols: int) -> JSONResponse | None:
    height, width = grid_shape(rows, cols, params.scale, params.pad)
    if height * width <= MAX_PIXELS:
        return None
    message = (f"n, cols, scale, pad: the grid would be {width}x{height} px "
               f"({height * width / 1e6:.1f} MP); at most {MAX_PIXELS / 1e6:.0f} MP per image, "
               f"so lower n, scale or pad")
    detail = [{"loc": ["query", "n"], "msg": message, "type": "value_error", "input": params.n}]
    return JSONResponse({"message": message, "detail": detail}, status_code=422)


def config_summary(loaded: Loaded) -> dict:
    config = loaded.sampler.config
    return {"dataset": config.dataset, "architecture": config.architecture,
            "hidden_sizes": list(config.hidden_sizes), "latent_dim": config.latent_dim,
            "activation": config.activation, "likelihood": config.likelihood,
            "ema_decay": config.ema_decay}


# ---- the app -------------------------------------------------------------------------------


def create_app(checkpoint_dir: str | Path, *, poll_interval: float = 2.0, max_batch: int = 1024,
               max_wait_ms: float = 2.0, queue_size: int = 256,
               block_rows: int = DEFAULT_BLOCK_ROWS, request_timeout: float = 30.0,
               bench_routes: bool = False) -> FastAPI:
    """The service for `checkpoint_dir` (see the module docstring).

    max_batch: rows per decode call; max_wait_ms: how long the oldest queued request may wait
    for company; queue_size: queued requests before 503; block_rows: the fixed decode block;
    bench_routes: also serve the baselines `bench/bench_service.py` compares against.
    """
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        watcher = CheckpointWatcher(checkpoint_dir, block_rows, metrics, poll_interval)
        await asyncio.to_thread(watcher.refresh)  # load + compile before accepting requests
        batcher = Batcher(max_rows=max_batch, max_wait=max_wait_ms / 1000,
                          queue_size=queue_size, on_batch=metrics.observe_batch).start()
        watcher.start()
        app.state.watcher, app.state.batcher = watcher, batcher
        sighup = _install_sighup(watcher)
        try:
            yield
        finally:
            if sighup:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            await asyncio.to_thread(watcher.stop)
            await asyncio.to_thread(batcher.stop)

    app = FastAPI(title="cvae sampling service", lifespan=lifespan,
                  description="Class-conditioned VAE digits as PNG grids. See DESIGN.md.")
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.state.metrics = metrics
    index_html = (STATIC_DIR / "index.html").read_text()

    @app.get("/sample", response_class=Response, responses=SAMPLE_RESPONSES)
    async def sample(request: Request, params: Annotated[SampleParams, Depends(sample_params)]):
        """A PNG grid of generated digits (8-bit grayscale; layout as torchvision make_grid)."""
        loaded = request.app.state.watcher.current
        if loaded is None:
            return error(503, request.app.state.watcher.note,
                         headers={"Retry-After": str(max(1, round(poll_interval)))})
        digits = DIGITS if params.digit is None else (params.digit,)
        cols = grid_columns(params.digit, params.n, params.cols)
        rows = len(digits) * params.n
        if (refusal := too_large(params, rows, cols)) is not None:
            return refusal
        seed = secrets.randbelow(RANDOM_SEED_LIMIT) if params.seed is None else params.seed
        job = Job(loaded.sampler, LatentRequest(seed, digits, params.n, params.temperature),
                  finish=functools.partial(encode_png, cols=cols, scale=params.scale,
                                           pad=params.pad))
        try:
            future = request.app.state.batcher.submit(job)
        except QueueFull:
            metrics.rejected.inc()
            return error(503, "busy: the request queue is full; retry shortly",
                         headers={"Retry-After": str(RETRY_AFTER_BUSY_S)})
        try:
            png = await asyncio.wait_for(asyncio.wrap_future(future), request_timeout)
        except (TimeoutError, Stopped):
            return error(503, "the request could not be served in time; retry shortly",
                         headers={"Retry-After": str(RETRY_AFTER_BUSY_S)})
        return Response(png, media_type="image/png", headers={
            "X-Checkpoint-Step": str(loaded.step), "X-Seed": str(seed),
            "Cache-Control": "no-store"})

    @app.get("/healthz", responses={200: {"content": {"application/json": {"schema": {
        "type": "object", "properties": {"status": {"const": "ok"}}, "required": ["status"]}}}}})
    async def healthz():
        """The process is alive (says nothing about the model)."""
        return {"status": "ok"}

    @app.get("/readyz", response_model=None,
             responses={200: {"model": Ready}, 503: {"model": NotReady}})
    async def readyz(request: Request):
        """200 once a checkpoint is loaded and compiled: its step and config; else 503."""
        watcher = request.app.state.watcher
        loaded = watcher.current
        if loaded is None:
            return error(503, watcher.note, status="not ready",
                         checkpoint_dir=str(watcher.directory))
        return {"status": "ready", "step": loaded.step, "checkpoint_dir": str(watcher.directory),
                "config": config_summary(loaded), "note": watcher.note,
                "loaded_at": loaded.loaded_at}

    @app.get("/metrics", response_class=Response, responses={200: {
        "description": "Prometheus text exposition format",
        "content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def prometheus_metrics(request: Request):
        """Prometheus text format: requests by status, latency, batch sizes, checkpoint step."""
        metrics.queue_depth.set(request.app.state.batcher.depth)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index():
        return HTMLResponse(index_html)

    if bench_routes:
        _add_bench_routes(app)
    return app


# ---- the server ----------------------------------------------------------------------------


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the two time limits uvicorn lacks, so slow or abandoned
    clients cost a connection for a bounded time only:

    - `read_timeout`: a whole request (head and any body) must arrive within this many seconds
      of the connection opening or of the previous response ending. uvicorn only times idle
      keep-alive connections, and restarts that timer at every byte, so half a request head, or
      one trickled a byte at a time, would hold the connection for ever.
    - `write_timeout`: a client that stops reading while a response is unsent (the transport's
      buffer above its high-water mark) is cut off after this many seconds. Without it the
      response stays buffered (and the socket open) for as long as the client likes.

    uvicorn takes a protocol class, not options, so `serve` makes a subclass with the limits set.
    """

    read_timeout: float = 10.0
    write_timeout: float = 30.0

    def connection_made(self, transport) -> None:
        self._read_timer = self._write_timer = None
        super().connection_made(transport)
        self._await_request()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._request_received():
            self._read_timer = _cancel(self._read_timer)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self._request_received():
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
        super().connection_lost(exc)

    def _request_received(self) -> bool:
        return self.conn.their_state not in (h11.IDLE, h11.SEND_BODY)

    def _await_request(self) -> None:
        _cancel(self._read_timer)
        self._read_timer = self.loop.call_later(self.read_timeout, self._read_timed_out)

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if not self._request_received() and not self.transport.is_closing():
            log.info("closing a connection from %s: no complete request within %g s",
                     self.client, self.read_timeout)
            self.transport.close()

    def _write_timed_out(self) -> None:
        self._write_timer = None
        log.info("dropping a connection to %s: it read nothing for %g s", self.client,
                 self.write_timeout)
        self.transport.abort()  # close() would wait for the buffer to drain


def _cancel(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()


def serve(checkpoint_dir: str | Path, host: str = "127.0.0.1", port: int = 8000, *,
          read_timeout: float = 10.0, write_timeout: float = 30.0, keep_alive: int = 5,
          access_log: bool = True, log_level: str = "info", **app_options) -> None:
    """Run the service under uvicorn (what `cvae serve` does) with bounded client timing:
    see `BoundedH11Protocol`; `keep_alive` is uvicorn's idle keep-alive timeout."""
    import uvicorn

    protocol = type("BoundedH11Protocol", (BoundedH11Protocol,),
                    {"read_timeout": read_timeout, "write_timeout": write_timeout})
    uvicorn.run(create_app(checkpoint_dir, **app_options), host=host, port=port, http=protocol,
                timeout_keep_alive=keep_alive, access_log=access_log, log_level=log_level)


def _install_sighup(watcher: CheckpointWatcher) -> bool:
    """SIGHUP = check the checkpoint directory now (only where the loop owns signals)."""
    if not hasattr(signal, "SIGHUP") or threading.current_thread() is not threading.main_thread():
        return False
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, watcher.wake)
    except (NotImplementedError, RuntimeError, ValueError):
        return False
    return True


def _add_bench_routes(app: FastAPI) -> None:
    """Baselines for bench/bench_service.py: per-request decode, and a fixed PNG (ceiling)."""
    fixed_png = png_bytes(np.zeros(grid_shape(16, 4), np.uint8))

    @app.get("/bench/unbatched", response_class=Response, include_in_schema=False)
    def unbatched(request: Request, params: Annotated[SampleParams, Depends(sample_params)]):
        # A plain `def` route: FastAPI runs it in its threadpool, one decode per request.
        loaded = request.app.state.watcher.current
        if loaded is None:
            return error(503, request.app.state.watcher.note)
        seed = secrets.randbelow(RANDOM_SEED_LIMIT) if params.seed is None else params.seed
        png = loaded.sampler.sample_png(params.digit, params.n, seed, params.temperature,
                                        params.cols, params.scale, params.pad)
        return Response(png, media_type="image/png", headers={
            "X-Checkpoint-Step": str(loaded.step), "X-Seed": str(seed)})

    @app.get("/bench/fixed", response_class=Response, include_in_schema=False)
    async def fixed():
        return Response(fixed_png, media_type="image/png")
