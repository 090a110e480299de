"""Continuous batching on the event loop: requests that arrive while one decode runs share the next.

Synopsis:

    batcher = Batcher(max_rows=4096, max_pending_rows=40960)
    request = LatentRequest(seed=1, digits=(7,), n=16, temperature=1.0)
    images = await batcher.decode(sampler, request)   # f32[16, h, w]; never blocks the loop
    images, label = await batcher.decode(sampler, transfer_request)   # a style transfer
    await batcher.stop()

Why this shape: on two cores the service is bound by per-request Python, not by the model, so
the request path must be as short as possible. Everything except the device work runs on the
event loop thread: `decode` appends the request to a list and awaits a plain asyncio future. One
drain task takes the pending requests (up to `max_rows` rows, all for the same model) and hands
them to a single worker thread that computes their latents in one call per kind of request
(`cvae.sampling.request_batches.request_rows`: prior draws bit-identical to `request_latents`,
latent walks, and style transfers, whose encoder work runs there too) and decodes them in one call
(`Sampler.decode`, fixed block shapes, so a request's pixels never depend on its neighbours).
A request may bring a `finish` function, which that thread runs on its images after the decode
(the service encodes small PNG grids there: the deflate releases the GIL); requests whose finish
has a `many` and is equal (one picture layout, `service.responses.GridEncoder`) are finished in
one call of it. That is one thread hop per batch, not per request, and no locks. While a batch
decodes, new requests gather for the next one: under load, batches grow by themselves; a lone
request is decoded at once, with no timer to wait on.

Admission is bounded by the rows pending or decoding: past `max_pending_rows` `decode` raises
`QueueFull` (the service answers 503 with Retry-After). A batch that takes longer than
`timeout` seconds fails its requests with `TimeoutError`, and a request that waited longer than
that before its batch started is failed the same way, so no request waits without end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
from typing import Callable, NamedTuple, Protocol

import numpy as np

from cvae.sampling.request_batches import request_rows
from cvae.sampling.latents import Codes

log = logging.getLogger(__name__)


class QueueFull(RuntimeError):
    """The batcher holds as much work as it may; try again shortly."""


class Stopped(RuntimeError):
    """The batcher is shutting down."""


class Decoder(Protocol):
    """What a batch is decoded with: usually a `cvae.sampling.sampler.Sampler` (one checkpoint)."""

    noise_dim: int  # the width of a prior draw (`Sampler.noise_dim`)

    def decode(self, z: np.ndarray, labels: np.ndarray) -> np.ndarray: ...

    # and, for batches with transfers, decode_codes(z, labels) (see cvae.sampling.sampler.Sampler)


class Request(Protocol):
    """A `cvae.sampling.sampler.LatentRequest`, `cvae.sampling.walks` walk or
    `cvae.sampling.transfer` request: `rows` images to decode."""

    @property
    def rows(self) -> int: ...


@dataclasses.dataclass(eq=False, slots=True)
class Pending:
    decoder: Decoder
    request: Request
    rows: int
    future: asyncio.Future
    arrived: float
    finish: Callable | None = None  # run on the result in the worker thread (e.g. the PNG)


class _Failed(NamedTuple):
    """A request's `finish` raised: its error, to set on its future alone."""

    error: BaseException


BatchHook = Callable[[int, int, int], None]  # (requests, rows, rows still pending) per batch


class Batcher:
    """Gathers concurrent `decode` calls into batches (see the module docstring)."""

    def __init__(self, max_rows: int = 4096, max_pending_rows: int = 40960,
                 timeout: float = 30.0, on_batch: BatchHook | None = None,
                 latents_fn: Callable[[list[Request], Decoder], list] = request_rows):
        if max_rows < 1 or max_pending_rows < 1 or timeout <= 0:
            raise ValueError("max_rows and max_pending_rows must be >= 1 and timeout > 0")
        self.max_rows, self.max_pending_rows, self.timeout = max_rows, max_pending_rows, timeout
        self.on_batch, self.latents_fn = on_batch, latents_fn
        self._pending: list[Pending] = []
        self._pending_rows = 0
        self._busy_rows = 0  # rows of the batch being decoded
        self._drain: asyncio.Task | None = None
        self._stopping = False
        self._worker = concurrent.futures.ThreadPoolExecutor(1, "cvae-decode")

    @property
    def depth(self) -> int:
        """Requests waiting for a decode."""
        return len(self._pending)

    async def decode(self, decoder: Decoder, request: Request, finish: Callable | None = None):
        """The request's images f32[rows, h, w], decoded together with whoever else is waiting;
        for a request whose latents come with more (a transfer's label), (images, label).
        `finish`: a function of that result to run in the worker thread after the decode, whose
        value is returned instead (the service encodes a small PNG there, off the event loop:
        the loop is the busier of the two cores); an error it raises fails this request only.

        Raises QueueFull at the bound (an idle batcher takes any one request), Stopped while
        shutting down, TimeoutError when the device does not answer in time.
        """
        if self._stopping:
            raise Stopped("the service is shutting down")
        rows = request.rows
        held = self._pending_rows + self._busy_rows
        if held and held + rows > self.max_pending_rows:
            raise QueueFull(f"{len(self._pending)} requests ({held} rows) already waiting")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append(Pending(decoder, request, rows, future, loop.time(), finish))
        self._pending_rows += rows
        if self._drain is None:
            self._drain = loop.create_task(self._drain_pending())
        return await future

    async def stop(self) -> None:
        """Fail the waiting requests, let the batch being decoded finish, stop the thread."""
        self._stopping = True
        self._fail(self._pending, Stopped("the service is shutting down"))
        self._pending, self._pending_rows = [], 0
        if self._drain is not None:
            await asyncio.wait([self._drain], timeout=self.timeout)
        await asyncio.to_thread(self._worker.shutdown, wait=True)

    # -- the drain task (event loop) -----------------------------------------------------------

    async def _drain_pending(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending and not self._stopping:
                batch = self._take(loop.time())
                if not batch:
                    continue
                rows = sum(item.rows for item in batch)
                self._busy_rows = rows
                if self.on_batch is not None:
                    self.on_batch(len(batch), rows, self._pending_rows)
                work = loop.run_in_executor(self._worker, self._decode_batch, batch)
                try:
                    images = await asyncio.wait_for(work, self.timeout)
                except Exception as error:  # a bug, a device failure or a hang: fail, keep serving
                    if not isinstance(error, TimeoutError):
                        log.error("decode of %d rows failed", rows, exc_info=error)
                    self._fail(batch, error)
                    continue
                finally:
                    self._busy_rows = 0
                for item, result in zip(batch, images):
                    if item.future.done():  # its request may have been cancelled
                        continue
                    if type(result) is _Failed:
                        item.future.set_exception(result.error)
                    else:
                        item.future.set_result(result)
        finally:
            self._drain = None

    def _take(self, now: float) -> list[Pending]:
        """The oldest waiting requests for the first one's model, up to max_rows rows (one
        larger request alone); requests that waited past the timeout are failed instead."""
        expired = [item for item in self._pending if now - item.arrived > self.timeout]
        if expired:
            self._fail(expired, TimeoutError("waited too long for a decode"))
        batch, rest, rows = [], [], 0
        for item in self._pending:
            if item in expired:
                continue
            fits = item.decoder is (batch[0].decoder if batch else item.decoder)
            if fits and (not batch or rows + item.rows <= self.max_rows):
                batch.append(item)
                rows += item.rows
            else:
                rest.append(item)
        self._pending = rest
        self._pending_rows = sum(item.rows for item in rest)
        return batch

    @staticmethod
    def _fail(items: list[Pending], error: BaseException) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(error)

    # -- the worker thread -----------------------------------------------------------------------

    def _decode_batch(self, batch: list[Pending]) -> list[np.ndarray]:
        decoder = batch[0].decoder
        latents = self.latents_fn([item.request for item in batch], decoder)
        results: list = [None] * len(batch)
        for codes in (False, True):  # prior draws in one call, transfers' codes in another
            members = [i for i, rows in enumerate(latents) if isinstance(rows, Codes) == codes]
            if not members:
                continue
            z = np.concatenate([latents[i][0] for i in members])
            labels = np.concatenate([latents[i][1] for i in members])
            images = (decoder.decode_codes if codes else decoder.decode)(z, labels)
            bounds = np.cumsum([batch[i].rows for i in members])[:-1]
            for i, part in zip(members, np.split(images, bounds)):
                label = latents[i].label if codes else None
                results[i] = part if label is None else (part, label)
        _finish(batch, results)
        return results


def _finish(batch: list[Pending], results: list) -> None:
    """Each request's `finish` run on its result, in place. Requests whose `finish` and row
    count are equal (one picture layout) go through one call of the finish's `many`, when it
    has one (`service.responses.GridEncoder`: the batch's PNGs laid out in one pass); the rest
    one by one. An error fails its own request alone: a `many` that raises is redone one by
    one to find it."""
    groups: dict[tuple, list[int]] = {}
    for i, item in enumerate(batch):
        if item.finish is not None:  # only a finish with `many` is grouped (and hashed)
            key = (item.finish, item.rows) if hasattr(item.finish, "many") else (None, i)
            groups.setdefault(key, []).append(i)
    for members in groups.values():
        finish = batch[members[0]].finish
        many = getattr(finish, "many", None)
        if many is not None and len(members) > 1 and all(
                type(results[i]) is np.ndarray for i in members):
            try:
                values = many([results[i] for i in members])
            except Exception:  # one request's pictures: found one by one below
                pass
            else:
                for i, value in zip(members, values, strict=True):
                    results[i] = value
                continue
        for i in members:
            try:
                results[i] = finish(results[i])
            except Exception as error:  # this request's alone
                results[i] = _Failed(error)
