"""A digit uploaded as the request body (`POST /transfer`; any route that reads a picture of a
digit): reading it, preparing it as MNIST was made, its errors and their OpenAPI entries.

The upload is the request body itself (`curl --data-binary @digit.png`), PNG or JPEG. Its size
is enforced while it is read (413 past `MAX_UPLOAD_BYTES`, before anything is decoded; a larger
Content-Length is refused without reading), and its pixel count from the image header, before
decoding (`cvae.data.digit_image`). Each bad upload gets the 422 body shape of the other routes:
`message` (one sentence for people) and `detail` (where, what).

Synopsis (in a route):

    upload = await read_digit(request, params.prepare,
                              shape=spec_of(sampler.config.data.dataset).stored_shape)
    if isinstance(upload, Response):
        return upload                      # the 413 / 415 / 422 to answer instead
    image, digest = upload                 # uint8[h, w], sha256 of the body (for an ETag)
"""

from __future__ import annotations

import asyncio
import hashlib

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse

from cvae.data import digit_image
from cvae.limits import MAX_INPUT_PIXELS, MAX_UPLOAD_BYTES
from service.responses import BadParameters

# Bad uploads: (HTTP status, `detail` type) per kind of `cvae.data.digit_image.ImageInputError`.
IMAGE_ERRORS = {
    digit_image.UnsupportedImage: (415, "unsupported_media_type"),
    digit_image.ImageTooLarge: (413, "image_too_large"),
    digit_image.DamagedImage: (422, "damaged_image"),
    digit_image.NoDigit: (422, "no_digit"),
    digit_image.WrongSize: (422, "wrong_size"),
}

BINARY = {"type": "string", "format": "binary"}
# The route's `openapi_extra`: the body is the image file itself.
UPLOAD_BODY = {"requestBody": {
    "required": True,
    "description": (f"the picture of one digit: the bytes of a PNG or JPEG file, at most "
                    f"{MAX_UPLOAD_BYTES:,} bytes and {MAX_INPUT_PIXELS:,} pixels; dark on "
                    "light or light on dark (told apart by the border)"),
    "content": {"image/png": {"schema": BINARY}, "image/jpeg": {"schema": BINARY}}}}
# The error responses an upload adds, in the 422 shape of the other routes.
UPLOAD_RESPONSES = {
    413: {"model": BadParameters, "description": f"body over {MAX_UPLOAD_BYTES:,} bytes, or "
          f"an image over {MAX_INPUT_PIXELS:,} pixels (refused from its header, before "
          "decoding)"},
    415: {"model": BadParameters, "description": "the body is not a PNG or JPEG image (or is "
          "empty)"},
}


class BodyTooLarge(Exception):
    """The request body is over MAX_UPLOAD_BYTES."""


async def read_digit(request: Request, prepare: digit_image.Prepare, *, shape: tuple[int, ...]
                     ) -> tuple[np.ndarray, str] | JSONResponse:
    """(the prepared uint8[*shape] digit, sha256 of the body), or the error to answer instead.
    `shape`: the served model's images, (h, w) of its dataset's spec. Decoding and preparing
    run on a thread, off the event loop."""
    try:
        body = await read_body(request)
    except BodyTooLarge:
        return body_too_large()
    try:
        return await asyncio.to_thread(prepare_upload, body, prepare, shape)
    except digit_image.ImageInputError as problem:
        return image_error(problem)


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


def prepare_upload(body: bytes, prepare: digit_image.Prepare, shape: tuple[int, ...]
                   ) -> tuple[np.ndarray, str]:
    """(the prepared uint8[*shape] image, sha256 of the body for the ETag); blocking: run it
    in a thread. Raises `cvae.data.digit_image.ImageInputError`."""
    image = digit_image.prepare_digit(body, prepare, shape=shape)
    return image, hashlib.sha256(body).hexdigest()


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
