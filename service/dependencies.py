"""What every route shares: the model this worker serves, and the batched decode.

Synopsis (in a route):

    async def route(request: Request, loaded: ServedModel):      # 503 until a model is loaded
        images = await decode(request, loaded, LatentRequest(seed, digits, n, temperature))
        if isinstance(images, Response):
            return images                                         # busy or too slow: 503

Both read what the app's lifespan put in `app.state` (service/app.py): the checkpoint watcher,
the batcher and the metrics.
"""

from __future__ import annotations

import asyncio
import random
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from cvae.limits import MAX_SEED
from service.batching import QueueFull, Stopped
from service.checkpoints import CheckpointWatcher, Loaded
from service.responses import busy

RANDOM_SEED_LIMIT = MAX_SEED + 1  # drawn seeds cover the same range as given ones


async def served_model(request: Request) -> Loaded:
    """The checkpoint this worker serves; 503 (with where it looked) until one is loaded."""
    watcher: CheckpointWatcher = request.app.state.watcher
    loaded = watcher.current
    if loaded is None:
        raise HTTPException(503, watcher.note, headers={
            "Retry-After": str(max(1, round(watcher.poll_interval)))})
    return loaded


ServedModel = Annotated[Loaded, Depends(served_model)]


def random_seed() -> int:
    """A seed for a request that gave none (returned to the client as X-Seed). From Python's
    `random`, which reseeds from the OS in every forked worker; not from `secrets`, which
    reads the OS's entropy on every call: a seed is no secret, the reply carries it."""
    return random.randrange(RANDOM_SEED_LIMIT)


async def decode(request: Request, loaded: Loaded, work, finish=None):
    """The batcher's result for `work` (a request of service/batching.py) on the served
    sampler (`finish`'s value of it, when given: see `Batcher.decode`), or the 503 to answer
    instead."""
    try:
        return await request.app.state.batcher.decode(loaded.sampler, work, finish)
    except QueueFull:
        request.app.state.metrics.rejected.inc()
        return busy("busy: the request queue is full; retry shortly")
    except (TimeoutError, Stopped):
        return busy("the request could not be served in time; retry shortly")


def cache_control(request: Request) -> str:
    """Cache-Control of a seeded picture (`cvae serve --cache-max-age`)."""
    return request.app.state.cache_control


async def kernel_signature(loaded: Loaded, *groups: str) -> bytes:
    """`Sampler.signature` of `groups` (for an ETag), checked on a thread the first time:
    a server checks only `decode`'s blocks before it answers."""
    sampler = loaded.sampler
    if sampler.checked(*groups):
        return sampler.signature(*groups)
    return await asyncio.to_thread(sampler.signature, *groups)
