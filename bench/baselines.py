"""The service with two baseline routes added, for bench/bench_service.py only.

    app = create_bench_app("checkpoints")   # the real app + /bench/plain + /bench/fixed

- `/bench/plain`: the same picture as `/sample` from a plain per-request `async def` route that
  decodes inline on the event loop: what a straightforward FastAPI implementation does.
- `/bench/fixed`: a constant PNG of the same size: the framework's ceiling on this machine.

They are not part of the production app (`service.app.create_app`), which never serves them.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Annotated

import numpy as np
from fastapi import Depends, FastAPI
from fastapi.responses import Response

from cvae.sampling.grid import grid_shape, png_bytes
from service.app import create_app
from service.dependencies import RANDOM_SEED_LIMIT, served_model
from service.params import SampleParams, sample_params
from service.checkpoints import Loaded


def create_bench_app(checkpoint_dir: str | Path, **options) -> FastAPI:
    app = create_app(checkpoint_dir, **options)
    fixed_png = png_bytes(np.zeros(grid_shape(16, 4), np.uint8))

    @app.get("/bench/plain", response_class=Response, include_in_schema=False)
    async def plain(params: Annotated[SampleParams, Depends(sample_params)],
                    loaded: Annotated[Loaded, Depends(served_model)]):
        seed = secrets.randbelow(RANDOM_SEED_LIMIT) if params.seed is None else params.seed
        png = loaded.sampler.sample_png(params.digit, params.n, seed,
                                        temperature=params.temperature,
                                        cols=params.cols, scale=params.scale, pad=params.pad)
        return Response(png, media_type="image/png", headers={
            "X-Checkpoint-Step": str(loaded.step), "X-Seed": str(seed)})

    @app.get("/bench/fixed", response_class=Response, include_in_schema=False)
    async def fixed():
        return Response(fixed_png, media_type="image/png")

    return app


def create_bench_app_from_env() -> FastAPI:
    """`create_bench_app($CVAE_CHECKPOINT_DIR)`: for servers that take an app factory with no
    arguments (bench/bench_servers.py runs uvicorn's and granian's own process managers)."""
    import os

    return create_bench_app(os.environ["CVAE_CHECKPOINT_DIR"])
