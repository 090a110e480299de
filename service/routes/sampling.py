"""Generated digits: `GET /sample` (a grid of samples) and `GET /interpolate` (latent walks).

Both answer a PNG grid decoded through the batcher. A seeded request carries a strong ETag and
is answered 304 when `If-None-Match` matches, without decoding; an unseeded one draws a seed,
returns it as X-Seed, and is never cached.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute

from cvae.sampling.walks import DigitWalk, LatentWalk
from cvae.sampling.grid import grid_columns
from cvae.sampling.latents import LatentRequest
from cvae.data.specs import spec_of
from service.dependencies import (RANDOM_SEED_LIMIT, ServedModel, cache_control, decode,
                                  kernel_signature, random_seed, served_model)
from service.params import (SAMPLE_QUERY, InterpolateParams, SampleParams, check_labels,
                            class_label, sample_params)
from service.responses import (SAMPLE_RESPONSES, encode_png, entity_tag, etag_matches,
                               png_encoder, too_large)

router = APIRouter()


class SampleRoute(APIRoute):
    """`/sample`'s route, documented and matched as FastAPI's, but whose handler calls its two
    dependencies and the endpoint directly. FastAPI's generic handler (the dependency solver,
    its cache and exit stacks, the checks on the solved values) cost about a tenth of the event
    loop's time per request at concurrency 64. The same dependencies run in the same order and
    raise the same exceptions, which the app's handlers answer as before (422, 503)."""

    def get_route_handler(self):
        endpoint = self.endpoint

        async def handler(request: Request) -> Response:
            params = await sample_params(request)
            return await endpoint(request, params, await served_model(request))

        return handler


async def sample(request: Request, params: Annotated[SampleParams, Depends(sample_params)],
                 loaded: ServedModel):
    """A PNG grid of generated images of one class (`digit` or `label`, by name), or one row
    per class: 8-bit grayscale, or RGB for a colour model; layout as torchvision make_grid."""
    classes = loaded.sampler.classes  # the served model's dataset's labels
    check_labels(len(classes), digit=params.digit)
    digit = class_label(spec_of(loaded.sampler.config.data.dataset).class_names, params.label,
                        digit=params.digit)
    digits = classes if digit is None else (digit,)
    cols = grid_columns(digit, params.n, params.cols)
    shape = spec_of(loaded.sampler.config.data.dataset).stored_shape
    if (refusal := too_large(params, len(digits) * params.n, cols,
                             image_shape=shape)) is not None:
        return refusal
    if params.seed is None:
        seed = random_seed()
        headers = {"X-Checkpoint-Step": str(loaded.step), "X-Seed": str(seed),
                   "Cache-Control": "no-store"}
    else:
        seed = params.seed
        etag = entity_tag(loaded, "sample", (digit, params.n, cols, seed,
                                             params.temperature, params.scale, params.pad))
        headers = {"X-Checkpoint-Step": str(loaded.step), "X-Seed": str(seed),
                   "ETag": etag, "Cache-Control": cache_control(request)}
        if etag_matches(request.headers.get("if-none-match"), etag):
            return Response(status_code=304, headers=headers)
    finish = png_encoder(len(digits) * params.n, cols, params.scale, params.pad,
                         image_shape=shape)
    result = await decode(request, loaded, LatentRequest(seed, digits, params.n,
                                                         params.temperature), finish)
    if isinstance(result, Response):
        return result
    png = result if finish else await encode_png(result, cols, params.scale, params.pad,
                                                 image_shape=shape)
    return Response(png, media_type="image/png", headers=headers)


router.add_api_route("/sample", sample, methods=["GET"], response_class=Response,
                     responses=SAMPLE_RESPONSES, openapi_extra=SAMPLE_QUERY,
                     route_class_override=SampleRoute)
SAMPLE_ROUTE = router.routes[-1]  # the app answers it past the router (service/direct.py)


@router.get("/interpolate", response_class=Response, responses=SAMPLE_RESPONSES)
async def interpolate(request: Request, params: Annotated[InterpolateParams, Query()],
                      loaded: ServedModel):
    """A walk through the latent space: `walk=latent` goes from seed's sample to to_seed's
    (one row per digit); `walk=digits` keeps each z and decodes it as every digit."""
    seed = random_seed() if params.seed is None else params.seed
    classes = loaded.sampler.classes
    check_labels(len(classes), digit=params.digit)
    digit = class_label(spec_of(loaded.sampler.config.data.dataset).class_names, params.label,
                        digit=params.digit)
    if params.walk == "latent":
        digits = classes if digit is None else (digit,)
        to_seed = (seed + 1) % RANDOM_SEED_LIMIT if params.to_seed is None else params.to_seed
        work = LatentWalk(seed, to_seed, digits, params.steps, params.temperature)
        cols = params.cols or params.steps
    else:
        work = DigitWalk(seed, digit or 0, params.n, params.temperature, classes)
        cols = params.cols or len(classes)
    count = "steps" if params.walk == "latent" else "n"
    shape = spec_of(loaded.sampler.config.data.dataset).stored_shape
    if (refusal := too_large(params, work.rows, cols, count, image_shape=shape)) is not None:
        return refusal
    headers = {"X-Checkpoint-Step": str(loaded.step), "X-Seed": str(seed),
               "Cache-Control": "no-store"}
    if params.seed is not None:
        headers["ETag"] = entity_tag(loaded, "interpolate", (
            params.walk, *work, cols, params.scale, params.pad),
            await kernel_signature(loaded, "codes"))
        headers["Cache-Control"] = cache_control(request)
        if etag_matches(request.headers.get("if-none-match"), headers["ETag"]):
            return Response(status_code=304, headers=headers)
    finish = png_encoder(work.rows, cols, params.scale, params.pad, image_shape=shape)
    result = await decode(request, loaded, work, finish)
    if isinstance(result, Response):
        return result
    png = result if finish else await encode_png(result, cols, params.scale, params.pad,
                                                 image_shape=shape)
    return Response(png, media_type="image/png", headers=headers)
