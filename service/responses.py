"""What the routes answer: the shapes of their replies (for the OpenAPI schema: /docs, and what
fuzzing checks replies against), the PNG grid, its cache validators, and the error replies.

A seeded picture is a pure function of the served weights and the query, so it carries a strong
ETag (`entity_tag`) and may be cached; `If-None-Match` is answered 304 (`etag_matches`) without
decoding. A grid over `MAX_PIXELS` is refused with a 422 (`too_large`) before any work.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from typing import Any, Literal

import numpy as np
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from cvae.sampling.grid import grid_png, grid_pngs, grid_shape
from cvae.data.specs import spec_of
from cvae.model.registry import noise_dim
from service.checkpoints import Loaded

MAX_PIXELS = 64_000_000  # one grid at most 64 MP (n=1024, scale 8, one digit is 52 MP)
RETRY_AFTER_BUSY_S = 1


# ---- reply shapes ----------------------------------------------------------------------------


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
    chosen_by: str = Field(description="`cvae serve --step`: latest (the newest step, followed), "
                                       "best (the lowest validation loss, followed) or the "
                                       "step number")
    pid: int = Field(description="the worker process that answered")
    checkpoint_dir: str
    fingerprint: str = Field(description="sha256 of the served weights (with the JAX version "
                                         "and backend, and the bits this machine's kernels give "
                                         "a fixed probe): equal on replicas that serve equal "
                                         "weights with kernels that round alike")
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


def config_summary(loaded: Loaded) -> dict:
    """/readyz's `config`: what a person checks to see which model answers."""
    config = loaded.sampler.config
    spec = spec_of(config.data.dataset)
    model = config.to_dict()["model"]
    return {"dataset": config.data.dataset, "class_names": list(spec.class_names),
            "image_shape": list(spec.image_shape), "model": model["name"],
            "model_options": model["options"], "noise_dim": noise_dim(config),
            "prior": config.prior.name, "likelihood": config.likelihood.name,
            "ema_decay": config.optimizer.ema_decay, "truncation": config.drawing.truncation}


# ---- the picture -----------------------------------------------------------------------------

# Grids up to this many pixels (a 16-digit grid at scale 8 has 0.2 MP) are encoded on the event
# loop, which is cheapest; larger ones on a thread (zlib releases the GIL), so that one big
# picture never holds up the small requests behind it.
INLINE_ENCODE_PIXELS = 1 << 18


async def encode_png(images: np.ndarray, cols: int, scale: int, pad: int, *,
                     image_shape: tuple[int, ...]) -> bytes:
    """images f32[R, *image_shape] -> PNG grid bytes (grey, or RGB); `image_shape`: the served
    model's dataset's (`DatasetSpec.stored_shape`)."""
    height, width = grid_shape(len(images), cols, scale=scale, pad=pad, image_shape=image_shape)
    encode = GridEncoder(cols, scale, pad, tuple(image_shape))
    if height * width <= INLINE_ENCODE_PIXELS:
        return encode(images)
    return await asyncio.to_thread(encode, images)


@dataclasses.dataclass(frozen=True)
class GridEncoder:
    """A request's `finish` for the batcher: images -> the PNG bytes `encode_png` gives them.
    Equal encoders are one layout, so the batcher encodes the pictures of a batch's requests
    with equal encoders and row counts in one call (`many`, the same bytes)."""

    cols: int
    scale: int
    pad: int
    image_shape: tuple[int, ...]

    def __call__(self, images: np.ndarray) -> bytes:
        return grid_png(images, self.cols, pad=self.pad, scale=self.scale,
                        image_shape=self.image_shape)

    def many(self, grids: list[np.ndarray]) -> list[bytes]:
        return grid_pngs(grids, self.cols, pad=self.pad, scale=self.scale,
                         image_shape=self.image_shape)


def png_encoder(tiles: int, cols: int, scale: int, pad: int, *,
                image_shape: tuple[int, ...]) -> GridEncoder | None:
    """For a grid small enough to encode inline (`INLINE_ENCODE_PIXELS`), its `GridEncoder` to
    hand the batcher as `finish`, so that the decode thread encodes it beside the decode
    instead of the event loop; None for a larger one, which `encode_png` encodes on a thread of
    its own so that it never holds up the decodes."""
    height, width = grid_shape(tiles, cols, scale=scale, pad=pad, image_shape=image_shape)
    if height * width > INLINE_ENCODE_PIXELS:
        return None
    return GridEncoder(cols, scale, pad, tuple(image_shape))


def entity_tag(loaded: Loaded, route: str, values: tuple, kernels: bytes = b"") -> str:
    """Strong ETag of a seeded picture: a hash of what decides its bytes (the served weights'
    fingerprint, the route and its parameters, and `kernels`: the bits this machine gives the
    functions it runs besides `decode`, `Sampler.signature`), prefixed with the step for
    people."""
    key = f"{loaded.fingerprint} {route} {values!r}{' ' + kernels.hex() if kernels else ''}"
    key = key.encode()
    return f'"{loaded.step}-{hashlib.sha256(key).hexdigest()[:24]}"'


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """RFC 9110 If-None-Match: `*`, or any listed tag equal to ours by weak comparison."""
    if not if_none_match:
        return False
    if if_none_match.strip() == "*":
        return True
    return any(tag.strip().removeprefix("W/") == etag for tag in if_none_match.split(","))


# ---- errors ----------------------------------------------------------------------------------


def error(status_code: int, message: str, headers: dict | None = None, **extra) -> JSONResponse:
    return JSONResponse({"detail": message, **extra}, status_code=status_code, headers=headers)


def busy(message: str) -> JSONResponse:
    """503 with Retry-After: the queue is full, or a decode took too long."""
    return error(503, message, headers={"Retry-After": str(RETRY_AFTER_BUSY_S)})


def too_large(params, tiles: int, cols: int, count: str = "n", *,
              image_shape: tuple[int, ...]) -> JSONResponse | None:
    """The 422 for a grid of `tiles` of `image_shape` (h, w) over MAX_PIXELS (None when it
    fits); `count` names the parameter that sets the number of tiles."""
    height, width = grid_shape(tiles, cols, scale=params.scale, pad=params.pad,
                               image_shape=image_shape)
    if height * width <= MAX_PIXELS:
        return None
    message = (f"{count}, cols, scale, pad: the grid would be {width}x{height} px "
               f"({height * width / 1e6:.1f} MP); at most {MAX_PIXELS / 1e6:.0f} MP per image, "
               f"so lower {count}, scale or pad")
    detail = [{"loc": ["query", count], "msg": message, "type": "value_error",
               "input": getattr(params, count)}]
    return JSONResponse({"message": message, "detail": detail}, status_code=422)
