"""The HTTP shapes of `POST /transfer` and `GET /interpolate`: parameters, the uploaded image,
its errors, and their OpenAPI entries. The routes themselves are in service/app.py.

The upload is the request body itself (`curl --data-binary @digit.png`), PNG or JPEG. Its size
is enforced while it is read (413 past `MAX_UPLOAD_BYTES`, before anything is decoded; a larger
Content-Length is refused without reading), and its pixel count from the image header, before
decoding (`cvae.digit_image`). Each bad upload gets the 422 body shape of the other routes:
`message` (one sentence for people) and `detail` (where, what).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Annotated, Literal

import numpy as np
from fastapi import Query, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from cvae import digit_image
from cvae.limits import (DEFAULT_PAD, DEFAULT_SCALE, DEFAULT_STEPS, DEFAULT_TEMPERATURE,
                         MAX_INPUT_PIXELS, MAX_N, MAX_PAD, MAX_POSTERIOR_SAMPLES, MAX_SCALE,
                         MAX_SEED, MAX_STEPS, MAX_TEMPERATURE, MAX_UPLOAD_BYTES)
from cvae.sampling import DIGITS

# What each new query parameter accepts, as the 422 message words it (service/app.py).
PARAMETER_RULES = {
    "label": "an integer in 0..9 (the digit the image shows), or omitted to let the model read it",
    "digits": "integers in 0..9, given 1 to 10 times (digits=3&digits=5), or omitted for 0-9",
    "samples": f"an integer in 0..{MAX_POSTERIOR_SAMPLES} (0: the posterior mean)",
    "prepare": "mnist (fit the digit as MNIST was made) or none (a 28x28 image as it is)",
    "show_input": "true or false",
    "walk": "latent (between two seeds, per digit) or digits (one z through the ten digits)",
    "to_seed": f"an integer in 0..{MAX_SEED}",
    "steps": f"an integer in 2..{MAX_STEPS}",
}

# Bad uploads: (HTTP status, `detail` type) per kind of `cvae.digit_image.ImageInputError`.
IMAGE_ERRORS = {
    digit_image.UnsupportedImage: (415, "unsupported_media_type"),
    digit_image.ImageTooLarge: (413, "image_too_large"),
    digit_image.DamagedImage: (422, "damaged_image"),
    digit_image.NoDigit: (422, "no_digit"),
    digit_image.WrongSize: (422, "wrong_size"),
}


# Query parameters the new routes share with /sample, as /sample words them.
Scale = Annotated[int, Query(ge=1, le=MAX_SCALE, description="integer upscale of each tile")]
Pad = Annotated[int, Query(ge=0, le=MAX_PAD, description="px around every tile")]
RandomSeed = Annotated[int | None, Query(ge=0, le=MAX_SEED,
                                         description="omit for a random one (see X-Seed)")]


class BodyTooLarge(Exception):
    """The request body is over MAX_UPLOAD_BYTES."""


@dataclasses.dataclass(frozen=True)
class TransferParams:
    label: int | None
    digits: tuple[int, ...]
    samples: int
    seed: int | None
    prepare: digit_image.Prepare
    show_input: bool
    cols: int | None
    scale: int
    pad: int


async def transfer_params(
    label: Annotated[int | None, Query(ge=0, le=9, description="the digit the image shows; "
                                       "omit: the label with the best ELBO (see X-Label)")] = None,
    digits: Annotated[list[Annotated[int, Field(ge=0, le=9)]] | None, Query(
        min_length=1, max_length=10, description="labels to decode with, in order "
        "(repeat: digits=3&digits=5); omit for 0-9")] = None,
    samples: Annotated[int, Query(ge=0, le=MAX_POSTERIOR_SAMPLES, description="0: the posterior "
                                  "mean (one row); k: k posterior draws, one row each")] = 0,
    seed: RandomSeed = None,
    prepare: Annotated[Literal["mnist", "none"], Query(description="mnist: fit the digit into "
                       "20x20, centre of mass at the centre of 28x28; none: a 28x28 image as it "
                       "is (light on dark)")] = "mnist",
    show_input: Annotated[bool, Query(description="start every row with the prepared 28x28 "
                                      "input")] = False,
    cols: Annotated[int | None, Query(ge=1, le=MAX_N, description="default: one row per z "
                                      "(digits, plus 1 with show_input)")] = None,
    scale: Scale = DEFAULT_SCALE,
    pad: Pad = DEFAULT_PAD,
) -> TransferParams:
    return TransferParams(label, DIGITS if digits is None else tuple(digits), samples, seed,
                          prepare, show_input, cols, scale, pad)


@dataclasses.dataclass(frozen=True)
class InterpolateParams:
    walk: Literal["latent", "digits"]
    digit: int | None
    seed: int | None
    to_seed: int | None
    steps: int
    n: int
    temperature: float
    cols: int | None
    scale: int
    pad: int


async def interpolate_params(
    walk: Annotated[Literal["latent", "digits"], Query(
        description="latent: from seed's sample to to_seed's, per digit; digits: keep each z "
                    "and decode it as every digit 0-9")] = "latent",
    digit: Annotated[int | None, Query(ge=0, le=9, description="latent: 0-9, omit for a row per "
                                       "digit; digits: whose samples are kept (default 0)")] = None,
    seed: RandomSeed = None,
    to_seed: Annotated[int | None, Query(ge=0, le=MAX_SEED, description="latent walk's far "
                                         "end; default seed + 1")] = None,
    steps: Annotated[int, Query(ge=2, le=MAX_STEPS, description="latent walk: tiles per row, "
                                "ends included")] = DEFAULT_STEPS,
    n: Annotated[int, Query(ge=1, le=MAX_N, description="digits walk: latents, one row "
                            "each")] = 1,
    temperature: Annotated[float, Query(gt=0, le=MAX_TEMPERATURE,
                                        description="z ~ N(0, t^2 I)")] = DEFAULT_TEMPERATURE,
    cols: Annotated[int | None, Query(ge=1, le=MAX_N, description="default: steps (latent), "
                                      "10 (digits)")] = None,
    scale: Scale = DEFAULT_SCALE,
    pad: Pad = DEFAULT_PAD,
) -> InterpolateParams:
    return InterpolateParams(walk, digit, seed, to_seed, steps, n, temperature, cols, scale, pad)


async def read_body(request: Request, limit: int = MAX_UPLOAD_BYTES) -> bytes:
    """The whole body, refused with BodyTooLarge as soon as it is known to be over `limit`
    bytes: from Content-Length before reading, else while reading (chunked uploads)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def body_error(status: int, kind: str, message: str) -> JSONResponse:
    """The 422 body shape of the other routes, for the uploaded image."""
    return JSONResponse({"message": f"body: {message}", "detail": [
        {"loc": ["body"], "msg": message, "type": kind}]}, status_code=status)


def image_error(error: digit_image.ImageInputError) -> JSONResponse:
    status, kind = IMAGE_ERRORS[type(error)]
    return body_error(status, kind, str(error))


def body_too_large() -> JSONResponse:
    return body_error(413, "body_too_large", f"the image is over {MAX_UPLOAD_BYTES:,} bytes "
                      f"({MAX_UPLOAD_BYTES // 2**20} MiB); send a smaller one")


BINARY = {"type": "string", "format": "binary"}
TRANSFER_BODY = {"requestBody": {
    "required": True,
    "description": (f"the picture of one digit: the bytes of a PNG or JPEG file, at most "
                    f"{MAX_UPLOAD_BYTES:,} bytes and {MAX_INPUT_PIXELS:,} pixels; dark on "
                    "light or light on dark (told apart by the border)"),
    "content": {"image/png": {"schema": BINARY}, "image/jpeg": {"schema": BINARY}}}}


def upload_responses(bad_parameters_model) -> dict:
    """The error responses an upload adds, in the 422 shape of the other routes."""
    return {
        413: {"model": bad_parameters_model, "description": f"body over {MAX_UPLOAD_BYTES:,} "
              f"bytes, or an image over {MAX_INPUT_PIXELS:,} pixels (refused from its header, "
              "before decoding)"},
        415: {"model": bad_parameters_model, "description": "the body is not a PNG or JPEG "
              "image (or is empty)"},
    }


def prepare_upload(body: bytes, prepare: digit_image.Prepare) -> tuple[np.ndarray, str]:
    """(the prepared uint8[28, 28] image, sha256 of the body for the ETag); blocking: run it
    in a thread. Raises `cvae.digit_image.ImageInputError`."""
    return digit_image.prepare_digit(body, prepare), hashlib.sha256(body).hexdigest()
