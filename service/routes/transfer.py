"""Handwriting style transfer: `POST /transfer` decodes an uploaded digit's style as every digit.

The upload is read and prepared by service/uploads.py; the encode (posterior) and decode run in
one batched request (`cvae.sampling.transfer.TransferRequest`).
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from cvae.sampling.transfer import TransferRequest, transfer_tiles
from cvae.data.specs import spec_of
from service.dependencies import (ServedModel, cache_control, decode, kernel_signature,
                                  random_seed)
from service.params import TransferParams, check_labels, class_label, prepare_mode
from service.responses import (IMAGE_HEADERS, SAMPLE_RESPONSES, BadParameters, encode_png,
                               entity_tag, too_large)
from service.uploads import UPLOAD_BODY, UPLOAD_RESPONSES, read_digit

TRANSFER_RESPONSES = {
    **SAMPLE_RESPONSES,
    200: {**SAMPLE_RESPONSES[200], "headers": {**IMAGE_HEADERS, "X-Label": {
        "description": "the digit the upload was encoded as: `label`, or the one the model "
                       "read", "schema": {"type": "integer"}}, "X-Label-Name": {
        "description": "that class's name, percent-encoded UTF-8", "schema": {"type": "string"}}}},
    422: {"model": BadParameters, "description": "a parameter is out of range, or the image is "
                                                 "damaged, blank, or not 28x28 with prepare=none"},
    **UPLOAD_RESPONSES,
}
del TRANSFER_RESPONSES[304]  # a POST is never answered 304 (see the route)

router = APIRouter()


@router.post("/transfer", response_class=Response, responses=TRANSFER_RESPONSES,
             openapi_extra=UPLOAD_BODY)
async def transfer(request: Request, params: Annotated[TransferParams, Query()],
                   loaded: ServedModel):
    """Handwriting style transfer: the uploaded digit's style (its posterior z) decoded as
    every digit in `digits`; one row per z. The body is the PNG or JPEG file itself.

    A deterministic result (the posterior mean, or draws with a seed) carries an ETag that
    covers the uploaded bytes, but is never answered 304: RFC 9110 answers a POST whose
    If-None-Match matches with 412, and shared caches do not store POST responses.
    """
    classes = loaded.sampler.classes
    check_labels(len(classes), digits=params.digits)
    label = class_label(spec_of(loaded.sampler.config.data.dataset).class_names, params.label)
    shape = spec_of(loaded.sampler.config.data.dataset).stored_shape
    prepare = prepare_mode(params.prepare, spec_of(loaded.sampler.config.data.dataset).channels)
    digits = params.digits or classes  # omitted: every class of the served model
    cols = params.cols or len(digits) + params.show_input
    tiles = (len(digits) + params.show_input) * max(1, params.samples)
    if (refusal := too_large(params, tiles, cols, "samples", image_shape=shape)) is not None:
        return refusal  # before the upload is read or decoded
    upload = await read_digit(request, prepare, shape=shape)
    if isinstance(upload, Response):
        return upload
    image, digest = upload
    seed = params.seed
    if params.samples and seed is None:
        seed = random_seed()
    headers = {"X-Checkpoint-Step": str(loaded.step)}
    if params.samples:
        headers["X-Seed"] = str(seed)
    if params.samples and params.seed is None:
        headers["Cache-Control"] = "no-store"
    else:
        # Encoded and decoded as codes; without a label, a few-label model reads it first.
        reads = label is None and loaded.sampler.has_classifier
        groups = ("codes", "reading") if reads else ("codes",)
        headers["ETag"] = entity_tag(loaded, "transfer", (
            digest, prepare, label, digits, params.samples,
            seed if params.samples else None, params.show_input, cols, params.scale,
            params.pad), await kernel_signature(loaded, *groups))
        headers["Cache-Control"] = cache_control(request)
    work = TransferRequest(image, label, digits, params.samples, seed or 0)
    result = await decode(request, loaded, work)
    if isinstance(result, Response):
        return result
    images, label = result
    headers["X-Label"] = str(label)
    headers["X-Label-Name"] = quote(
        spec_of(loaded.sampler.config.data.dataset).class_names[label], safe="")
    png = await encode_png(transfer_tiles(images, work, show_input=params.show_input), cols,
                           params.scale, params.pad, image_shape=shape)
    return Response(png, media_type="image/png", headers=headers)
