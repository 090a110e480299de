"""The query strings the routes take, each one pydantic model, and how a bad one is answered.

The parameters that mean the same on every route (`seed`, `scale`, `pad`) are field types
defined once here; each route's model lists its fields in the order its OpenAPI page shows
them. `/interpolate` and `/transfer` read theirs through FastAPI (`Annotated[Model, Query()]`),
which also writes their OpenAPI entries. `/sample`, the hot path, validates its query string in
one pydantic call (`query_model`) and describes it with `query_parameters`.

A label's range is the served model's dataset's (its spec's class count, 2 to
`cvae.limits.MAX_CLASSES`), which is known only once a checkpoint is loaded: the models bound
labels by `MAX_CLASSES`, and each route then checks them against the served model with
`check_labels`, whose 422 names the model's range. A
class may also be named (`label=dog`, or its index as text): `class_label` reads it against the
served model's class names (`cvae.data.class_names`), and an unknown one is a 422 that lists
them.

A bad query string is answered 422 with `message` (one sentence per bad parameter: its name,
what it accepts, the value given) and `detail` (FastAPI's list of problems). A parameter the
route does not take is a bad one too (`extra="forbid"`), so a typo such as `digits=7` on
`/sample` is refused, not silently ignored; the message names it and lists what the route takes.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Sequence
from typing import Annotated, Literal

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from cvae.limits import (DEFAULT_N, DEFAULT_PAD, DEFAULT_SCALE, DEFAULT_STEPS,
                         DEFAULT_TEMPERATURE, MAX_CLASSES, MAX_N, MAX_PAD, MAX_POSTERIOR_SAMPLES,
                         MAX_SCALE, MAX_SEED, MAX_STEPS, MAX_TEMPERATURE)
from cvae.data.class_names import UnknownLabel, describe_classes, label_index

LARGEST_LABEL = MAX_CLASSES - 1  # over every model; `check_labels` narrows it to the served one

# What each query parameter accepts, as the 422 message words it.
PARAMETER_RULES = {
    "digit": f"an integer in 0..{LARGEST_LABEL} that indexes a class of the served model, "
             "or omitted for one row per class",
    "n": f"an integer in 1..{MAX_N}",
    "cols": f"an integer in 1..{MAX_N}",
    "seed": f"an integer in 0..{MAX_SEED}",
    "temperature": f"a number with 0 < temperature <= {MAX_TEMPERATURE:g}",
    "scale": f"an integer in 1..{MAX_SCALE}",
    "pad": f"an integer in 0..{MAX_PAD}",
    "label": "a class of the served model, by its name or its index",
    "digits": f"integers in 0..{LARGEST_LABEL} that index classes of the served model, given "
              f"1 to {MAX_CLASSES} times (digits=3&digits=5), or omitted for every class",
    "samples": f"an integer in 0..{MAX_POSTERIOR_SAMPLES} (0: the posterior mean)",
    "prepare": "auto, mnist (fit a grey model's digit as MNIST was made), fit (the whole "
               "picture resized to the model's size) or none (an image of that size as it is)",
    "show_input": "true or false",
    "walk": "latent (between two seeds, per class) or digits (one z through every class)",
    "to_seed": f"an integer in 0..{MAX_SEED}",
    "steps": f"an integer in 2..{MAX_STEPS}",
}

# ---- parameters that mean the same on several routes -----------------------------------------


def _holds_int(annotation) -> bool:
    """Whether a field's type is, or holds, int (`int | None`, `list[Annotated[int, ...]]`)."""
    return annotation is int or any(map(_holds_int, typing.get_args(annotation)))


@functools.cache
def _int_field(model: type[BaseModel], name: str) -> bool:
    """`_holds_int` of a model's field, worked out once (it is asked on every request)."""
    return _holds_int(model.model_fields[name].annotation)


class QueryModel(BaseModel):
    """A route's query string, its integers as written. Pydantic's lax mode reads '7.0' as 7,
    which the schema (type integer) refuses, so a client that follows the schema and this
    service would disagree; such a value is refused as pydantic refuses 'seven'."""

    @field_validator("*", mode="before")
    @classmethod
    def _whole_numbers(cls, value, info):
        if _int_field(cls, info.field_name):
            for item in value if isinstance(value, list) else (value,):
                if isinstance(item, str) and not item.strip().lstrip("+-").isdigit():
                    raise PydanticCustomError("int_parsing", "Input should be a valid "
                                              "integer, unable to parse string as an integer")
        return value


Seed = Annotated[int | None, Field(ge=0, le=MAX_SEED,
                                   description="omit for a random one (see X-Seed)")]
Scale = Annotated[int, Field(ge=1, le=MAX_SCALE, description="integer upscale of each tile")]
Pad = Annotated[int, Field(ge=0, le=MAX_PAD, description="px around every tile")]
PrepareMode = Annotated[Literal["auto", "mnist", "fit", "none"], Field(
    description="mnist: fit the digit into 20x20, centre of mass at the centre of 28x28 (grey "
                "models); fit: the whole picture cropped to the model's aspect ratio and "
                "resized to its size, in colour for a colour model; none: an image of the "
                "model's size as it is (light on dark when grey); auto: mnist for a grey "
                "model, fit for a colour one")]
# A class by name ("dog", "Ankle boot") or by its index as text ("7").
ClassName = Annotated[str | None, Field(min_length=1, max_length=200, description=(
    "a class by its name in the served model's dataset (see /readyz's config.class_names) or "
    "its index"))]


class SampleParams(QueryModel):
    """`/sample`'s query parameters (also `/bench/plain`'s)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    digit: int | None = Field(None, ge=0, le=LARGEST_LABEL,
                              description="a class by index, 0 to the served model's class "
                                          "count - 1; omit: one row per class")
    label: ClassName = None
    n: int = Field(DEFAULT_N, ge=1, le=MAX_N, description="samples per digit")
    cols: int | None = Field(None, ge=1, le=MAX_N,
                             description="default ceil(sqrt(n)); n without digit")
    seed: Seed = None
    temperature: float = Field(DEFAULT_TEMPERATURE, gt=0, le=MAX_TEMPERATURE,
                               description="the sampling noise is N(0, t^2 I); the "
                                           "model's prior maps it to its latent")
    scale: Scale = DEFAULT_SCALE
    pad: Pad = DEFAULT_PAD


class InterpolateParams(QueryModel):
    """`/interpolate`'s query parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    walk: Literal["latent", "digits"] = Field(
        "latent", description="latent: from seed's sample to to_seed's, per class; digits: "
                              "keep each z and decode it as every class of the served model")
    digit: int | None = Field(None, ge=0, le=LARGEST_LABEL,
                              description="a class by index; latent: omit for a row per "
                              "class; digits: whose samples are kept (default 0)")
    label: ClassName = None
    seed: Seed = None
    to_seed: int | None = Field(None, ge=0, le=MAX_SEED,
                                description="latent walk's far end; default seed + 1")
    steps: int = Field(DEFAULT_STEPS, ge=2, le=MAX_STEPS,
                       description="latent walk: tiles per row, ends included")
    n: int = Field(1, ge=1, le=MAX_N, description="digits walk: latents, one row each")
    temperature: float = Field(DEFAULT_TEMPERATURE, gt=0, le=MAX_TEMPERATURE,
                               description="z ~ N(0, t^2 I)")
    cols: int | None = Field(None, ge=1, le=MAX_N,
                             description="default: steps (latent), the class count "
                                         "(digits)")
    scale: Scale = DEFAULT_SCALE
    pad: Pad = DEFAULT_PAD


class TransferParams(QueryModel):
    """`/transfer`'s query parameters; `digits` is a tuple, None (every class of the served
    model) when omitted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: str | None = Field(None, min_length=1, max_length=200,
                              description="the class the image shows, by name or index; "
                              "omit: the label with the best ELBO (see X-Label)")
    digits: list[Annotated[int, Field(ge=0, le=LARGEST_LABEL)]] | None = Field(
        None, min_length=1, max_length=MAX_CLASSES, validate_default=True,
        description="classes by index to decode with, in order (repeat: digits=3&digits=5); "
                    "omit for every class of the served model")
    samples: int = Field(0, ge=0, le=MAX_POSTERIOR_SAMPLES, description="0: the posterior "
                         "mean (one row); k: k posterior draws, one row each")
    seed: Seed = None
    prepare: PrepareMode = "auto"
    show_input: bool = Field(False, description="start every row with the prepared 28x28 "
                                                "input")
    cols: int | None = Field(None, ge=1, le=MAX_N, description="default: one row per z "
                             "(digits, plus 1 with show_input)")
    scale: Scale = DEFAULT_SCALE
    pad: Pad = DEFAULT_PAD

    @field_validator("digits")
    @classmethod
    def _digits_as_tuple(cls, digits: list[int] | None) -> tuple[int, ...] | None:
        # A tuple: it goes into the ETag's key as it always has, and into the decode request.
        # None: every class of the served model (`Sampler.classes`), which the route fills in.
        return None if digits is None else tuple(digits)


# ---- /sample's own fast path -----------------------------------------------------------------


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
    Only for models without list fields (a repeated parameter keeps its last value here).
    Starlette's query parameters are copied into a plain dict first (the last of a repeated
    name): pydantic reads a dict in C, Starlette's mapping one Python call per field.
    """
    async def parse(request: Request):
        query = dict(request.query_params.items())
        try:
            return model.model_validate(query)
        except ValidationError as invalid:
            raise RequestValidationError([{**e, "loc": ("query", *e["loc"])}
                                          for e in invalid.errors(include_url=False)]) from None
    return parse


sample_params = query_model(SampleParams)
SAMPLE_QUERY = {"parameters": query_parameters(SampleParams)}


# ---- the 422 ---------------------------------------------------------------------------------


def label_rules(classes: int) -> dict[str, str]:
    """What `digit` and `digits` accept on a model of `classes` classes, as the 422 words it."""
    within = f"in 0..{classes - 1} (this model's classes)"
    return {"digit": f"an integer {within}, or omitted for one row per class",
            "digits": f"integers {within}, given 1 to {classes} times (digits=3&digits=5), "
                      f"or omitted for every class"}


def describe_errors(errors: list[dict], route: str = "", parameters: Sequence[str] = (), *,
                    rules: dict[str, str] | None = None) -> str:
    """One sentence per bad parameter: 'digit: must be an integer in 0..9 (this model's
    classes), ... (got '10')', or 'digits: unknown parameter (got '7')', then once what `route`
    takes, if one was unknown. `rules`: the served model's words for some parameters
    (`label_rules`), over `PARAMETER_RULES`'."""
    rules = {**PARAMETER_RULES, **(rules or {})}
    parts, unknown = [], False
    for item in errors:
        loc = item.get("loc") or ()
        name = next((part for part in reversed(loc) if isinstance(part, str)), "request")
        if item.get("type") == "extra_forbidden":
            unknown = True
            parts.append(f"{name}: unknown parameter (got {item.get('input')!r})")
        elif name in rules:
            rule = (item.get("ctx") or {}).get("rule") or rules[name]
            parts.append(f"{name}: must be {rule} (got {item.get('input')!r})")
        else:
            parts.append(f"{'.'.join(map(str, loc))}: {item.get('msg')}")
    message = "; ".join(parts)
    if unknown:
        takes = ", ".join(parameters) if parameters else "no query parameters"
        message += f" ({route or 'this route'} takes {takes})"
    return message


def check_labels(classes: int, **labels: int | tuple[int, ...] | None) -> None:
    """Raises the 422 of a bad query string, naming the model's range (`label_rules`), for
    each label (digit=, digits=) outside 0..classes - 1, the served model's, and for more
    digits= than it has classes; None (omitted) passes."""
    errors = []
    for name, value in labels.items():
        values = value if isinstance(value, tuple) else (value,)
        if any(v is not None and v >= classes for v in values) or len(values) > classes:
            rule = label_rules(classes)[name]
            written = [str(v) for v in values] if isinstance(value, tuple) else str(value)
            errors.append({"type": "less_than_equal", "loc": ("query", name),  # as pydantic's
                           "msg": f"Input should be less than or equal to {classes - 1}",
                           "input": written, "ctx": {"le": classes - 1, "rule": rule}})
    if errors:
        raise RequestValidationError(errors)


def class_label(names: Sequence[str], label: str | None, *, digit: int | None = None
                ) -> int | None:
    """The class a route reads: `label` (a name of `names`, the served model's, or an index)
    when given, else `digit` (already bounded by `check_labels`). Raises the 422 of a bad
    query string, listing the names, for an unknown label or one given beside `digit`."""
    if label is None:
        return digit
    if digit is not None:
        rule = "omitted when digit is given (the same choice, by index)"
    else:
        try:
            return label_index(names, label)
        except UnknownLabel:
            rule = f"a class of this model: {describe_classes(names)}"
    raise RequestValidationError([{"type": "unknown_class", "loc": ("query", "label"),
                                   "msg": f"Input should be {rule}", "input": label,
                                   "ctx": {"rule": rule, "classes": list(names)}}])


def prepare_mode(prepare: str, channels: int) -> str:
    """`prepare` for a model of `channels` (1 or 3): auto made concrete; mnist refused with
    the 422 of a bad query string for a colour model (no digit to centre)."""
    if prepare == "auto":
        return "mnist" if channels == 1 else "fit"
    if prepare == "mnist" and channels != 1:
        rule = "fit or none for this colour model (mnist centres a grey digit)"
        raise RequestValidationError([{"type": "literal_error", "loc": ("query", "prepare"),
                                       "msg": f"Input should be {rule}", "input": prepare,
                                       "ctx": {"rule": rule}}])
    return prepare


def route_parameters(request: Request) -> list[str]:
    """The query parameters of the request's route, as its OpenAPI entry lists them."""
    path = getattr(request.scope.get("route"), "path", None)
    operation = request.app.openapi()["paths"].get(path, {}).get(request.method.lower(), {})
    return [item["name"] for item in operation.get("parameters", ()) if item["in"] == "query"]


def served_classes(request: Request) -> int | None:
    """The class count of the model this worker serves; None before one is loaded."""
    watcher = getattr(request.app.state, "watcher", None)
    loaded = None if watcher is None else watcher.current
    return None if loaded is None else len(loaded.sampler.classes)


async def validation_error_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    """The 422 of a bad query string, a label out of range worded with the served model's
    classes once one is loaded (`label_rules`)."""
    errors = jsonable_encoder(exc.errors())
    classes = served_classes(request)
    message = describe_errors(errors, request.url.path, route_parameters(request),
                              rules=None if classes is None else label_rules(classes))
    return JSONResponse({"message": message, "detail": errors}, status_code=422)

