"""Dynamic batching: concurrent requests share one decode call, off the event loop.

Synopsis:

    batcher = Batcher(max_rows=1024, max_wait=0.002, queue_size=256)
    batcher.start()
    request = LatentRequest(seed=1, digits=(7,), n=16, temperature=1.0)
    future = batcher.submit(Job(sampler, request, finish=lambda images: png(images)))
    png = await asyncio.wrap_future(future)   # never blocks the event loop
    batcher.stop()

A request becomes a `Job`: its `LatentRequest` (seed, digits, n, temperature: its latent rows
z f32[R, L] and labels i32[R] are a function of these alone, so its pixels do not depend on
who shares the batch; the worker draws the rows of a whole batch in one call with
`cvae.sampling.batch_latents`, bit-identical to `request_latents`), the model that must decode
them (requests keep the weights they started with across a checkpoint swap) and a `finish`
function (grid + PNG) run on a small encoder pool. One worker thread takes the oldest job, waits
at most `max_wait` seconds after that job arrived for more (only while other requests are in
flight, i.e. being encoded or sent, so more are likely to come; under load the queue is already
full and nobody waits), concatenates up to `max_rows` rows per model and decodes them with
`model.decode`, which runs fixed-size padded blocks, so nothing recompiles. Admission is bounded
by jobs and by rows in flight (queued, decoding or encoding): when either is exhausted `submit`
raises `QueueFull` and the service answers 503 with Retry-After instead of queueing without end.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Protocol

import numpy as np

from cvae.sampling import LatentRequest, batch_latents

log = logging.getLogger(__name__)


class QueueFull(RuntimeError):
    """The batcher holds as much work as it may; try again shortly."""


class Stopped(RuntimeError):
    """The batcher is shutting down."""


class Decoder(Protocol):
    def decode(self, z: np.ndarray, labels: np.ndarray) -> np.ndarray: ...


@dataclasses.dataclass(eq=False)
class Job:
    """One request's rows. `decoder` is usually a `cvae.sampling.Sampler` (one checkpoint)."""

    decoder: Decoder  # has .config.latent_dim and .decode(z, labels)
    request: LatentRequest
    finish: Callable[[np.ndarray], Any] = lambda images: images  # f32[R, 28, 28] -> result
    future: concurrent.futures.Future = dataclasses.field(
        default_factory=concurrent.futures.Future)
    arrived: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def rows(self) -> int:
        return len(self.request.digits) * self.request.n


BatchHook = Callable[[int, int], None]  # (jobs, rows) of each decode call, for metrics


class Batcher:
    """A bounded queue of `Job`s and one decode worker thread (see the module docstring)."""

    def __init__(self, max_rows: int = 1024, max_wait: float = 0.002, queue_size: int = 256,
                 max_inflight_rows: int = 4 * 10240, encoder_threads: int = 2,
                 on_batch: BatchHook | None = None,
                 latents_fn: Callable[[list[LatentRequest], int], list] = batch_latents):
        if max_rows < 1 or queue_size < 1 or max_wait < 0:
            raise ValueError("max_rows and queue_size must be >= 1 and max_wait >= 0")
        self.max_rows, self.max_wait, self.queue_size = max_rows, max_wait, queue_size
        self.max_inflight_rows = max_inflight_rows
        self.on_batch, self.latents_fn = on_batch, latents_fn
        self._queue: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._inflight_rows = 0
        self._stopping = False
        self._worker = threading.Thread(target=self._run, name="cvae-batcher", daemon=True)
        self._encoder = concurrent.futures.ThreadPoolExecutor(encoder_threads, "cvae-encode")

    # -- producer side (any thread, never blocks) --------------------------------------------

    def start(self) -> Batcher:
        self._worker.start()
        return self

    def submit(self, job: Job) -> concurrent.futures.Future:
        """Queue `job`; raises QueueFull at the bound (an empty batcher takes any one job)."""
        with self._cond:
            if self._stopping:
                raise Stopped("the service is shutting down")
            busy = self._queue or self._inflight_rows
            if busy and (len(self._queue) >= self.queue_size
                         or self._inflight_rows + job.rows > self.max_inflight_rows):
                raise QueueFull(f"{len(self._queue)} requests ({self._inflight_rows} rows) "
                                f"already queued")
            self._inflight_rows += job.rows
            self._queue.append(job)
            self._cond.notify()
        return job.future

    @property
    def depth(self) -> int:
        return len(self._queue)

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the jobs being decoded, fail the queued ones, stop the threads."""
        with self._cond:
            self._stopping = True
            abandoned = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for job in abandoned:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(Stopped("the service is shutting down"))
        if self._worker.is_alive():
            self._worker.join(timeout)
        self._encoder.shutdown(wait=True, cancel_futures=False)

    # -- worker side ---------------------------------------------------------------------------

    def _take_batch(self) -> list[Job] | None:
        """Blocks for the oldest job, then gathers more until max_rows or its wait runs out."""
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            batch, rows = [], 0
            while True:
                while self._queue and rows + self._queue[0].rows <= self.max_rows:
                    job = self._queue.popleft()
                    batch.append(job)
                    rows += job.rows
                if not batch:  # one job bigger than max_rows: decode it alone
                    batch.append(self._queue.popleft())
                    return batch
                if self._queue or rows >= self.max_rows:
                    return batch  # full, or the next job would not fit
                if self._inflight_rows <= rows:
                    return batch  # nobody else in flight (a lone client): waiting gains nothing
                remaining = batch[0].arrived + self.max_wait - time.monotonic()
                if remaining <= 0 or self._stopping:
                    return batch
                self._cond.wait(remaining)

    def _run(self) -> None:
        while (batch := self._take_batch()) is not None:
            live = [job for job in batch if job.future.set_running_or_notify_cancel()]
            self._release([job for job in batch if job not in live])
            # Jobs of different checkpoints (a swap while queued) are decoded separately.
            groups: dict[int, list[Job]] = {}
            for job in live:
                groups.setdefault(id(job.decoder), []).append(job)
            for jobs in groups.values():
                self._decode(jobs)

    def _decode(self, jobs: list[Job]) -> None:
        try:
            latents = self.latents_fn([job.request for job in jobs],
                                      jobs[0].decoder.config.latent_dim)
            z = np.concatenate([z for z, _ in latents])
            labels = np.concatenate([labels for _, labels in latents])
            images = jobs[0].decoder.decode(z, labels)
        except Exception as error:  # a bug or a device failure: fail these jobs, keep serving
            log.exception("decode of %d rows failed", sum(job.rows for job in jobs))
            for job in jobs:
                job.future.set_exception(error)
            self._release(jobs)
            return
        if self.on_batch is not None:
            self.on_batch(len(jobs), len(z))
        start = 0
        for job in jobs:
            rows = images[start:start + job.rows]
            start += job.rows
            self._encoder.submit(self._finish, job, rows)

    def _finish(self, job: Job, images: np.ndarray) -> None:
        try:
            job.future.set_result(job.finish(images))
        except Exception as error:
            job.future.set_exception(error)
        finally:
            self._release([job])

    def _release(self, jobs: list[Job]) -> None:
        if jobs:
            with self._cond:
                self._inflight_rows -= sum(job.rows for job in jobs)
