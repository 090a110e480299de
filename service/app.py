"""The FastAPI sampling service: `GET /sample` draws PNG digit grids from the latest checkpoint;
`POST /transfer` writes an uploaded digit's hand as every digit; `GET /interpolate` walks the
latent space.

Synopsis:

    app = create_app("checkpoints")           # what each `cvae serve` worker runs
    with TestClient(app) as client:           # the lifespan loads and compiles the model
        png = client.get("/sample", params={"digit": 7, "seed": 1}).content

The lifespan loads the newest readable checkpoint (service/checkpoints.py) and compiles the
decode sampler before it lets requests in; a watcher thread then swaps in newer steps. Routes
get the model being served from the `served_model` dependency (503 until one is loaded) and
decode through the `Batcher` (service/batching.py), which batches concurrent requests on the
event loop. A seeded picture is a pure function of the checkpoint and the query, so it carries
a strong ETag and may be cached; `If-None-Match` is answered 304 without decoding. The service
never writes to the checkpoint directory. The HTTP contract is docs/design.md, "HTTP service".
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import os
import secrets
import signal
import threading
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cvae.digit_image import ImageInputError
from cvae.grid import grid_shape, make_grid, png_bytes
from cvae.interpolation import DigitWalk, LatentWalk
from cvae.limits import (DEFAULT_N, DEFAULT_PAD, DEFAULT_SCALE, DEFAULT_TEMPERATURE, MAX_N,
                         MAX_PAD, MAX_SCALE, MAX_SEED, MAX_TEMPERATURE)
from cvae.sampling import DIGITS, LatentRequest, grid_columns
from cvae.transfer import TransferRequest, transfer_tiles
from service import transfer_api
from service.batching import Batcher, QueueFull, Stopped
from service.checkpoints import CheckpointWatcher, Loaded
from service.metrics import CONTENT_TYPE, Metrics, MetricsMiddleware
from service.transfer_api import (TRANSFER_BODY, BodyTooLarge, InterpolateParams,
                                  TransferParams, interpolate_params, transfer_params)

STATIC_DIR = Path(__file__).parent / "static"
RANDOM_SEED_LIMIT = MAX_SEED + 1  # drawn seeds cover the same range as given ones
MAX_PIXELS = 64_000_000  # one grid at most 64 MP (n=1024, scale 8, one digit is 52 MP)
RETRY_AFTER_BUSY_S = 1

# What each query parameter accepts, as the 422 message words it.
PARAMETER_RULES = {
    "digit": "an integer in 0..9, or omitted for one row per digit",
    "n": f"an integer in 1..{MAX_N}",
    "cols": f"an integer in 1..{MAX_N}",
    "seed": f"an integer in 0..{MAX_SEED}",
    "temperature": f"a number with 0 < temperature <= {MAX_TEMPERATURE:g}",
    "scale": f"an integer in 1..{MAX_SCALE}",
    "pad": f"an integer in 0..{MAX_PAD}",
    **transfer_api.PARAMETER_RULES,
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
    pid: int = Field(description="the worker process that answered")


class Ready(BaseModel):
    status: Literal["ready"]
    step: int = Field(description="the checkpoint step this worker serves")
    pid: int = Field(description="the worker process that answered")
    checkpoint_dir: str
    fingerprint: str = Field(description="sha256 of the served weights (with the JAX version "
                                         "and backend): equal on replicas that serve equal "
                                         "weights")
    config: dict[str, Any]
    note: str | None = Field(description="e.g. newer checkpoints that could not be read")
    loaded_at: float = Field(description="Unix time the step was loaded")


RETRY_AFTER_HEADER = {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}}
IMAGE_HEADERS = {
    "X-Checkpoint-Step": {"description": "the step whose weights drew it",
                          "schema": {"type": "integer"}},
    "X-Seed": {"description": "the seed used, also when drawn at random",
               "schema": {"type": "integer"}},
    "ETag": {"description": "seeded requests only: strong validator of these exact bytes",
             "schema": {"type": "string"}},
    "Cache-Control": {"description": "seeded: public, max-age; unseeded: no-store",
                      "schema": {"type": "string"}},
}
SAMPLE_RESPONSES = {
    200: {"description": "PNG grid (8-bit grayscale)",
          "content": {"image/png": {"schema": {"type": "string", "format": "binary"}}},
          "headers": IMAGE_HEADERS},
    304: {"description": "seeded request whose ETag matches If-None-Match: the cached copy is "
                         "current", "headers": IMAGE_HEADERS},
    422: {"model": BadParameters, "description": "a parameter is out of range, or the grid "
                                                 f"would be over {MAX_PIXELS // 10**6} MP"},
    503: {"model": Unavailable, "headers": RETRY_AFTER_HEADER,
          "description": "no checkpoint yet, or busy: retry after Retry-After seconds"},
}
TRANSFER_RESPONSES = {
    **SAMPLE_RESPONSES,
    200: {**SAMPLE_RESPONSES[200], "headers": {**IMAGE_HEADERS, "X-Label": {
        "description": "the digit the upload was encoded as: `label`, or the one the model "
                       "read", "schema": {"type": "integer"}}}},
    422: {"model": BadParameters, "description": "a parameter is out of range, or the image is "
                                                 "damaged, blank, or not 28x28 with prepare=none"},
    **transfer_api.upload_responses(BadParameters),
}
del TRANSFER_RESPONSES[304]  # a POST is never answered 304 (see the route)


# ---- dependencies ------------------------------------------------------------------------


class SampleParams(BaseModel):
    """`/sample`'s query parameters (also `/bench/plain`'s)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    digit: int | None = Field(None, ge=0, le=9, description="0-9; omit: one row per digit")
    n: int = Field(DEFAULT_N, ge=1, le=MAX_N, description="samples per digit")
    cols: int | None = Field(None, ge=1, le=MAX_N,
                             description="default ceil(sqrt(n)); n without digit")
    seed: int | None = Field(None, ge=0, le=MAX_SEED,
                             description="omit for a random one (see X-Seed)")
    temperature: float = Field(DEFAULT_TEMPERATURE, gt=0, le=MAX_TEMPERATURE,
                               description="the sampling noise is N(0, t^2 I); the "
                                           "model's prior maps it to its latent")
    scale: int = Field(DEFAULT_SCALE, ge=1, le=MAX_SCALE,
                       description="integer upscale of each tile")
    pad: int = Field(DEFAULT_PAD, ge=0, le=MAX_PAD, description="px around every tile")


def query_parameters(model: type[BaseModel]) -> list[dict]:
    """OpenAPI `parameters` for a model read from the query string by `query_model`."""
    schema = model.model_json_schema()
    return [{"name": name, "in": "query", "required": name in schema.get("required", ()),
             "description": field.pop("description", ""),
             "schema": {k: v for k, v in field.items() if k != "title"}}
            for name, field in schema["properties"].items()]


def query_model(model: type[BaseModel]):
    """A dependency that validates the query string as `model` in one pydantic call.

    FastAPI's own per-parameter parsing costs about 0.04 ms more per request (measured), a
    tenth of this service's budget; errors come out the same (422, loc ["query", name]).
    """
    async def parse(request: Request):
        try:
            return model.model_validate(request.query_params)
        except ValidationError as invalid:
            raise RequestValidationError([{**e, "loc": ("query", *e["loc"])}
                                          for e in invalid.errors(include_url=False)]) from None
    return parse


sample_params = query_model(SampleParams)
SAMPLE_QUERY = {"parameters": query_parameters(SampleParams)}


async def served_model(request: Request) -> Loaded:
    """The checkpoint this worker serves; 503 (with where it looked) until one is loaded."""
    watcher: CheckpointWatcher = request.app.state.watcher
    loaded = watcher.current
    if loaded is None:
        raise HTTPException(503, watcher.note, headers={
            "Retry-After": str(max(1, round(watcher.poll_interval)))})
    return loaded


# ---- responses -----------------------------------------------------------------------------


# Grids up to this many pixels (a 16-digit grid at scale 8 has 0.2 MP) are encoded on the event
# loop, which is cheapest; larger ones on a thread (zlib releases the GIL), so that one big
# picture never holds up the small requests behind it.
INLINE_ENCODE_PIXELS = 1 << 18


async def encode_png(images: np.ndarray, cols: int, scale: int, pad: int) -> bytes:
    """images f32[R, 28, 28] -> PNG grid bytes."""
    height, width = grid_shape(len(images), cols, scale, pad)
    if height * width <= INLINE_ENCODE_PIXELS:
        return png_bytes(make_grid(images, cols, pad=pad, scale=scale))
    return await asyncio.to_thread(
        lambda: png_bytes(make_grid(images, cols, pad=pad, scale=scale)))


def error(status_code: int, message: str, headers: dict | None = None, **extra) -> JSONResponse:
    return JSONResponse({"detail": message, **extra}, status_code=status_code, headers=headers)


def describe_errors(errors: list[dict]) -> str:
    """One sentence per bad parameter: 'digit: must be an integer in 0..9 (got '10')'."""
    parts = []
    for item in errors:
        loc = item.get("loc") or ()
        name = next((part for part in reversed(loc) if isinstance(part, str)), "request")
        if name in PARAMETER_RULES:
            parts.append(f"{name}: must be {PARAMETER_RULES[name]} (got {item.get('input')!r})")
        else:
            parts.append(f"{'.'.join(map(str, loc))}: {item.get('msg')}")
    return "; ".join(parts)


async def validation_error_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = jsonable_encoder(exc.errors())
    return JSONResponse({"message": describe_errors(errors), "detail": errors}, status_code=422)


def too_large(params, tiles: int, cols: int, count: str = "n") -> JSONResponse | None:
    """The 422 for a grid of `tiles` over MAX_PIXELS (None when it fits); `count` names the
    parameter that sets the number of tiles."""
    height, width = grid_shape(tiles, cols, params.scale, params.pad)
    if height * width <= MAX_PIXELS:
        return None
    message = (f"{count}, cols, scale, pad: the grid would be {width}x{height} px "
               f"({height * width / 1e6:.1f} MP); at most {MAX_PIXELS / 1e6:.0f} MP per image, "
               f"so lower {count}, scale or pad")
    detail = [{"loc": ["query", count], "msg": message, "type": "value_error",
               "input": getattr(params, count)}]
    return JSONResponse({"message": message, "detail": detail}, status_code=422)


def entity_tag(loaded: Loaded, route: str, values: tuple) -> str:
    """Strong ETag of a seeded picture: a hash of what decides its bytes (the served weights'
    fingerprint, the route and its parameters), prefixed with the step for people."""
    key = f"{loaded.fingerprint} {route} {values!r}".encode()
    return f'"{loaded.step}-{hashlib.sha256(key).hexdigest()[:24]}"'


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """RFC 9110 If-None-Match: `*`, or any listed tag equal to ours by weak comparison."""
    if not if_none_match:
        return False
    if if_none_match.strip() == "*":
        return True
    return any(tag.strip().removeprefix("W/") == etag for tag in if_none_match.split(","))


def config_summary(loaded: Loaded) -> dict:
    config = loaded.sampler.config
    return {"dataset": config.dataset, "architecture": config.architecture,
            "hidden_sizes": list(config.hidden_sizes), "latent_dim": config.latent_dim,
            "activation": config.activation, "likelihood": config.likelihood,
            "ema_decay": config.ema_decay}


# ---- the app -------------------------------------------------------------------------------


def create_app(checkpoint_dir: str | Path, *, poll_interval: float = 2.0,
               max_batch_rows: int = 4096, max_pending_rows: int = 40960,
               request_timeout: float = 30.0, cache_max_age: int = 600) -> FastAPI:
    """The service for `checkpoint_dir` (see the module docstring).

    max_batch_rows: latent rows per decode call; max_pending_rows: rows waiting or decoding
    before 503; request_timeout: seconds a decode may take before 503; cache_max_age: seconds
    browsers and CDNs may keep a seeded picture before revalidating it.
    """
    metrics = Metrics()
    cache_control = f"public, max-age={cache_max_age}"

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        watcher = CheckpointWatcher(checkpoint_dir, poll_interval, on_load=metrics.observe_load)
        await asyncio.to_thread(watcher.refresh)  # load + compile before accepting requests
        # Everything allocated so far (JAX, the frameworks, the model) is moved out of the
        # garbage collector's reach while serving: a full collection walks every tracked object
        # and held the event loop ~100 ms, which every request in flight waited for (the p99 at
        # concurrency 64, even for a constant PNG). Requests' garbage is collected as before.
        gc.collect()
        gc.freeze()
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
            gc.unfreeze()

    async def batched(batcher: Batcher, sampler, work):
        """The batcher's result for `work`, or the 503 to answer instead."""
        try:
            return await batcher.decode(sampler, work)
        except QueueFull:
            metrics.rejected.inc()
            return error(503, "busy: the request queue is full; retry shortly",
                         headers={"Retry-After": str(RETRY_AFTER_BUSY_S)})
        except (TimeoutError, Stopped):
            return error(503, "the request could not be served in time; retry shortly",
                         headers={"Retry-After": str(RETRY_AFTER_BUSY_S)})

    app = FastAPI(title="cvae sampling service", lifespan=lifespan,
                  description="Class-conditioned VAE digits as PNG grids. See docs/design.md.",
                  # The service reports through Prometheus (/metrics). FastAPI's OpenTelemetry
                  # hooks would look up the global providers on every request: 4% of a
                  # worker's Python time under load, for nothing.
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.state.metrics = metrics
    index_html = (STATIC_DIR / "index.html").read_text()

    @app.get("/sample", response_class=Response, responses=SAMPLE_RESPONSES,
             openapi_extra=SAMPLE_QUERY)
    async def sample(request: Request, params: Annotated[SampleParams, Depends(sample_params)],
                     loaded: Annotated[Loaded, Depends(served_model)]):
        """A PNG grid of generated digits (8-bit grayscale; layout as torchvision make_grid)."""
        digits = DIGITS if params.digit is None else (params.digit,)
        cols = grid_columns(params.digit, params.n, params.cols)
        if (refusal := too_large(params, len(digits) * params.n, cols)) is not None:
            return refusal
        if params.seed is None:
            seed = secrets.randbelow(RANDOM_SEED_LIMIT)
            headers = {"X-Checkpoint-Step": str(loaded.step), "X-Seed": str(seed),
                       "Cache-Control": "no-store"}
        else:
            seed = params.seed
            etag = entity_tag(loaded, "sample", (params.digit, params.n, cols, seed,
                                                 params.temperature, params.scale, params.pad))
            headers = {"X-Checkpoint-Step": str(loaded.step), "X-Seed": str(seed),
                       "ETag": etag, "Cache-Control": cache_control}
            if etag_matches(request.headers.get("if-none-match"), etag):
                return Response(status_code=304, headers=headers)
        images = await batched(request.app.state.batcher, loaded.sampler,
                               LatentRequest(seed, digits, params.n, params.temperature))
        if isinstance(images, Response):
            return images
        png = await encode_png(images, cols, params.scale, params.pad)
        return Response(png, media_type="image/png", headers=headers)

    @app.post("/transfer", response_class=Response, responses=TRANSFER_RESPONSES,
              openapi_extra=TRANSFER_BODY)
    async def transfer(request: Request,
                       params: Annotated[TransferParams, Depends(transfer_params)],
                       loaded: Annotated[Loaded, Depends(served_model)]):
        """Handwriting style transfer: the uploaded digit's style (its posterior z) decoded as
        every digit in `digits`; one row per z. The body is the PNG or JPEG file itself.

        A deterministic result (the posterior mean, or draws with a seed) carries an ETag that
        covers the uploaded bytes, but is never answered 304: RFC 9110 answers a POST whose
        If-None-Match matches with 412, and shared caches do not store POST responses.
        """
        cols = params.cols or len(params.digits) + params.show_input
        tiles = (len(params.digits) + params.show_input) * max(1, params.samples)
        if (refusal := too_large(params, tiles, cols, "samples")) is not None:
            return refusal  # before the upload is read or decoded
        try:
            body = await transfer_api.read_body(request)
        except BodyTooLarge:
            return transfer_api.body_too_large()
        try:
            image, digest = await asyncio.to_thread(transfer_api.prepare_upload, body,
                                                    params.prepare)
        except ImageInputError as problem:
            return transfer_api.image_error(problem)
        seed = params.seed
        if params.samples and seed is None:
            seed = secrets.randbelow(RANDOM_SEED_LIMIT)
        headers = {"X-Checkpoint-Step": str(loaded.step)}
        if params.samples:
            headers["X-Seed"] = str(seed)
        if params.samples and params.seed is None:
            headers["Cache-Control"] = "no-store"
        else:
            headers["ETag"] = entity_tag(loaded, "transfer", (
                digest, params.prepare, params.label, params.digits, params.samples,
                seed if params.samples else None, params.show_input, cols, params.scale,
                params.pad))
            headers["Cache-Control"] = cache_control
        work = TransferRequest(image, params.label, params.digits, params.samples, seed or 0)
        result = await batched(request.app.state.batcher, loaded.sampler, work)
        if isinstance(result, Response):
            return result
        images, label = result
        headers["X-Label"] = str(label)
        png = await encode_png(transfer_tiles(images, work, params.show_input), cols,
                               params.scale, params.pad)
        return Response(png, media_type="image/png", headers=headers)

    @app.get("/interpolate", response_class=Response, responses=SAMPLE_RESPONSES)
    async def interpolate(request: Request,
                          params: Annotated[InterpolateParams, Depends(interpolate_params)],
                          loaded: Annotated[Loaded, Depends(served_model)]):
        """A walk through the latent space: `walk=latent` goes from seed's sample to to_seed's
        (one row per digit); `walk=digits` keeps each z and decodes it as every digit."""
        seed = secrets.randbelow(RANDOM_SEED_LIMIT) if params.seed is None else params.seed
        if params.walk == "latent":
            digits = DIGITS if params.digit is None else (params.digit,)
            to_seed = (seed + 1) % RANDOM_SEED_LIMIT if params.to_seed is None else params.to_seed
            work = LatentWalk(seed, to_seed, digits, params.steps, params.temperature)
            cols = params.cols or params.steps
        else:
            work = DigitWalk(seed, params.digit or 0, params.n, params.temperature)
            cols = params.cols or len(DIGITS)
        count = "steps" if params.walk == "latent" else "n"
        if (refusal := too_large(params, work.rows, cols, count)) is not None:
            return refusal
        headers = {"X-Checkpoint-Step": str(loaded.step), "X-Seed": str(seed),
                   "Cache-Control": "no-store"}
        if params.seed is not None:
            headers["ETag"] = entity_tag(loaded, "interpolate", (
                params.walk, *work, cols, params.scale, params.pad))
            headers["Cache-Control"] = cache_control
            if etag_matches(request.headers.get("if-none-match"), headers["ETag"]):
                return Response(status_code=304, headers=headers)
        images = await batched(request.app.state.batcher, loaded.sampler, work)
        if isinstance(images, Response):
            return images
        png = await encode_png(images, cols, params.scale, params.pad)
        return Response(png, media_type="image/png", headers=headers)

    @app.get("/healthz", responses={200: {"content": {"application/json": {"schema": {
        "type": "object", "properties": {"status": {"const": "ok"}}, "required": ["status"]}}}}})
    async def healthz():
        """The process is alive (says nothing about the model)."""
        return {"status": "ok"}

    @app.get("/readyz", response_model=None,
             responses={200: {"model": Ready}, 503: {"model": NotReady}})
    async def readyz(request: Request):
        """200 once a checkpoint is loaded and compiled: the step this worker serves; else 503."""
        watcher: CheckpointWatcher = request.app.state.watcher
        loaded = watcher.current
        if loaded is None:
            return error(503, watcher.note, status="not ready",
                         checkpoint_dir=str(watcher.directory), pid=os.getpid())
        return {"status": "ready", "step": loaded.step, "pid": os.getpid(),
                "checkpoint_dir": str(watcher.directory), "fingerprint": loaded.fingerprint,
                "config": config_summary(loaded), "note": watcher.note,
                "loaded_at": loaded.loaded_at}

    @app.get("/metrics", response_class=Response, responses={200: {
        "description": "Prometheus text exposition format, summed over the machine's workers",
        "content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def prometheus_metrics():
        """Prometheus text format: requests by status, latency, batch sizes, checkpoint steps."""
        return Response(await asyncio.to_thread(metrics.exposition), media_type=CONTENT_TYPE)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index():
        return HTMLResponse(index_html)

    return app


def _install_sighup(watcher: CheckpointWatcher) -> bool:
    """SIGHUP = check the checkpoint directory now (only where the loop owns signals)."""
    if not hasattr(signal, "SIGHUP") or threading.current_thread() is not threading.main_thread():
        return False
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, watcher.wake)
    except (NotImplementedError, RuntimeError, ValueError):
        return False
    return True
