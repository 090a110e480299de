"""Reading a digit: `POST /classify` answers which digit the model reads in an uploaded picture:
with its classifier q(y|x) (a model trained with `cvae train --labels N`), or, for a model
trained with every label, by Bayes' rule, p(y|x) proportional to its bound on p(x|y) (every
class of the model in one call, fixed draws; `cvae.model.objectives`). The same JSON either way.

The upload is read and prepared exactly as `/transfer` prepares it (service/uploads.py), with
the same errors. The classifier runs through the sampler's fixed blocks (`Sampler.classify`),
on a worker thread, so a picture's probabilities never depend on anything else being served.
A sampler built without a reader (not one `load_sampler` builds) answers 409, saying so.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from cvae.data.specs import spec_of
from service.dependencies import ServedModel
from service.params import PrepareMode, prepare_mode
from service.responses import BadParameters
from service.uploads import UPLOAD_BODY, UPLOAD_RESPONSES, read_digit


class Reading(BaseModel):
    """200: the classifier's reading of the picture."""

    probabilities: list[float] = Field(min_length=1,  # a model of any class count
                                       description="p(y|x) for each of the served model's "
                                                   "classes y (0..9 for MNIST): q(y|x), or "
                                                   "Bayes' rule on p(x|y); they sum to 1")
    label: int = Field(ge=0, description="the most probable class's index")
    name: str = Field(description="the most probable class's name (its dataset's)")
    class_names: list[str] = Field(description="the classes' names, in the order of "
                                               "`probabilities`")
    step: int = Field(description="the checkpoint step that read it")


class ClassifyParams(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown parameter is a 422 that names it

    prepare: PrepareMode = "auto"


CLASSIFY_RESPONSES = {
    200: {"model": Reading, "description": "a probability for each of the served model's "
                                           "classes, the most probable class, and the "
                                           "checkpoint step",
          "headers": {"X-Checkpoint-Step": {"description": "the step whose weights read it",
                                            "schema": {"type": "integer"}}}},
    409: {"model": BadParameters, "description": "the served model reads no digits"},
    422: {"model": BadParameters, "description": "a parameter is out of range, or the image is "
                                                 "damaged, blank, or not 28x28 with prepare=none"},
    **UPLOAD_RESPONSES,
}

router = APIRouter()


@router.post("/classify", response_model=Reading, responses=CLASSIFY_RESPONSES,
             openapi_extra=UPLOAD_BODY)
async def classify(request: Request, response: Response,
                   params: Annotated[ClassifyParams, Query()], loaded: ServedModel):
    """The digit the model reads in the uploaded picture (the PNG or JPEG file itself, as
    `/transfer` takes it), with a probability for each of its classes: its classifier q(y|x),
    or Bayes' rule on its bounds on p(x|y) for a model trained with every label."""
    sampler = loaded.sampler
    if sampler.classify_fn is None:
        message = "the served model reads no digits"
        return JSONResponse({"message": message, "detail": [
            {"loc": ["body"], "msg": message, "type": "no_classifier"}]}, status_code=409)
    spec = spec_of(sampler.config.data.dataset)
    prepare = prepare_mode(params.prepare, spec.channels)
    upload = await read_digit(request, prepare, shape=spec.stored_shape)
    if isinstance(upload, JSONResponse):
        return upload
    image, _ = upload
    probabilities = (await asyncio.to_thread(sampler.classify, image[None]))[0]
    response.headers["X-Checkpoint-Step"] = str(loaded.step)
    label = int(probabilities.argmax())
    return Reading(probabilities=[float(p) for p in probabilities], label=label,
                   name=sampler.class_names[label], class_names=list(sampler.class_names),
                   step=loaded.step)
