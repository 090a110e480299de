"""service/batching.py on its own: fake decoders, no model, no HTTP."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from cvae.sampling.latents import LatentRequest, batch_latents, request_latents
from cvae.sampling.grid import grid_png
from service.batching import Batcher, QueueFull, Stopped
from service.responses import GridEncoder


class FakeDecoder:
    """Images whose pixels all equal the row's first latent value; records each call's rows.
    `gate`, when given, holds every decode until it is set."""

    noise_dim = 2

    def __init__(self, gate: threading.Event | None = None):
        self.calls: list[int] = []
        self.gate = gate
        self.entered = threading.Event()

    def decode(self, z, labels):
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(30)
        self.calls.append(len(z))
        return np.repeat(z[:, :1, None], 28, axis=1).repeat(28, axis=2)


def fake_latents(requests, decoder):
    """Rows filled with the request's temperature, so each request's rows are recognisable."""
    return [(np.full((r.n, decoder.noise_dim), r.temperature, np.float32),
             np.zeros(r.n, np.int32)) for r in requests]


def request(rows: int, value: float) -> LatentRequest:
    return LatentRequest(0, (0,), rows, value)


async def until(predicate, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def held_decode(batcher: Batcher, first: LatentRequest):
    """`first` being decoded and held there: (the gate that lets it go, the decoder, its task)."""
    gate = threading.Event()
    decoder = FakeDecoder(gate)
    task = asyncio.create_task(batcher.decode(decoder, first))
    await until(decoder.entered.is_set)
    return gate, decoder, task


def test_requests_waiting_during_a_decode_share_the_next_one_and_get_their_own_rows():
    async def scenario():
        gate = threading.Event()
        first, second = FakeDecoder(gate), FakeDecoder(gate)
        batcher = Batcher(max_rows=10, latents_fn=fake_latents)
        lone = asyncio.create_task(batcher.decode(first, request(1, 9.0)))
        await until(first.entered.is_set)  # decoding alone: nothing else was waiting
        specs = [(first, 3, 1.0), (second, 2, 2.0), (first, 4, 3.0), (first, 5, 4.0)]
        waiting = [asyncio.create_task(batcher.decode(d, request(rows, value)))
                   for d, rows, value in specs]
        await until(lambda: batcher.depth == len(specs))
        gate.set()
        results = await asyncio.gather(lone, *waiting)
        await batcher.stop()
        for (_, rows, value), images in zip([(first, 1, 9.0), *specs], results):
            assert images.shape == (rows, 28, 28) and np.all(images == value)
        # One model per decode, oldest first, at most 10 rows: [1], then 3+4 (5 did not fit),
        # then 5; the other model's 2 rows in a call of their own.
        assert first.calls == [1, 7, 5] and second.calls == [2]

    asyncio.run(scenario())


def test_an_oversized_request_is_decoded_alone_and_admission_is_bounded_by_rows():
    async def scenario():
        batcher = Batcher(max_rows=4, max_pending_rows=12, latents_fn=fake_latents)
        gate, decoder, big = await held_decode(batcher, request(9, 1.0))  # idle: admitted
        queued = asyncio.create_task(batcher.decode(decoder, request(3, 2.0)))  # 9 + 3 = 12
        await until(lambda: batcher.depth == 1)
        with pytest.raises(QueueFull):
            await batcher.decode(decoder, request(1, 3.0))  # 13 rows > 12
        gate.set()
        assert (await big).shape == (9, 28, 28) and (await queued).shape == (3, 28, 28)
        assert decoder.calls == [9, 3]
        await batcher.stop()

    asyncio.run(scenario())


def test_a_decode_that_fails_or_hangs_fails_its_requests_and_the_batcher_keeps_serving():
    class Broken(FakeDecoder):
        def decode(self, z, labels):
            raise RuntimeError("device fell over")

    async def scenario():
        batcher = Batcher(timeout=0.3, latents_fn=fake_latents)
        with pytest.raises(RuntimeError, match="device fell over"):
            await batcher.decode(Broken(), request(2, 1.0))
        hung = FakeDecoder(threading.Event())  # never released
        with pytest.raises(TimeoutError):
            await batcher.decode(hung, request(2, 1.0))
        hung.gate.set()  # let the worker thread go, then serve again
        assert (await batcher.decode(FakeDecoder(), request(2, 5.0))).shape == (2, 28, 28)
        await batcher.stop()
        with pytest.raises(Stopped):
            await batcher.decode(FakeDecoder(), request(1, 1.0))

    asyncio.run(scenario())


def test_finish_runs_in_the_worker_thread_and_its_error_fails_its_request_alone():
    def broken(images):
        raise ValueError("cannot encode")

    async def scenario():
        batcher = Batcher(latents_fn=fake_latents)
        gate, decoder, first = await held_decode(batcher, request(1, 9.0))
        loop_thread = threading.get_ident()
        finished = asyncio.create_task(batcher.decode(
            decoder, request(2, 2.0), lambda images: (threading.get_ident(), images[:, 0, 0])))
        failed = asyncio.create_task(batcher.decode(decoder, request(3, 3.0), broken))
        plain = asyncio.create_task(batcher.decode(decoder, request(1, 4.0)))
        await until(lambda: batcher.depth == 3)
        gate.set()
        assert (await first).shape == (1, 28, 28)
        thread, values = await finished
        assert thread != loop_thread and values.tolist() == [2.0, 2.0]
        with pytest.raises(ValueError, match="cannot encode"):
            await failed
        assert (await plain)[0, 0, 0] == 4.0
        assert decoder.calls == [1, 6]  # the three shared one decode
        await batcher.stop()

    asyncio.run(scenario())


def test_finishes_of_one_layout_run_together_with_each_requests_bytes_and_errors_alone():
    """Requests with equal `GridEncoder`s and row counts get their PNGs from one `many` call,
    each the bytes `grid_png` gives it alone; a request whose pictures cannot be encoded fails
    alone, the others of its layout still answered."""

    def latents(requests, decoder):  # pixels from the temperature; NaN for a temperature of 0
        return [(np.full((r.n, decoder.noise_dim), np.nan if r.temperature == 0 else
                         r.temperature / 10, np.float32), np.zeros(r.n, np.int32))
                for r in requests]

    class CountingEncoder(GridEncoder):
        many_calls: list = []

        def many(self, grids):
            self.many_calls.append(len(grids))
            return super().many(grids)

    async def scenario():
        batcher = Batcher(latents_fn=latents)
        gate, decoder, first = await held_decode(batcher, request(1, 9.0))
        encoder = CountingEncoder(2, 1, 2, (28, 28))
        values = (1.0, 2.0, 0.0, 3.0)
        tasks = [asyncio.create_task(batcher.decode(decoder, request(4, v), encoder))
                 for v in values]
        other = asyncio.create_task(batcher.decode(decoder, request(2, 5.0), encoder))
        await until(lambda: batcher.depth == 5)
        gate.set()
        await first
        for value, task in zip(values, tasks):
            if value == 0.0:
                with pytest.raises(ValueError, match="NaN"):
                    await task
            else:
                assert await task == grid_png(np.full((4, 28, 28), value / 10), 2)
        assert await other == grid_png(np.full((2, 28, 28), 0.5), 2)
        # one call for the four 4-row requests (redone one by one for the NaN), none for the
        # lone 2-row one
        assert CountingEncoder.many_calls == [4]
        await batcher.stop()

    asyncio.run(scenario())


def test_a_finish_without_many_need_not_be_hashable():
    class Scale:  # defines __eq__ and no __hash__: unhashable, as any such callable may be
        def __init__(self, by):
            self.by = by

        def __eq__(self, other):
            return isinstance(other, Scale) and other.by == self.by

        def __call__(self, images):
            return images[:, 0, 0] * self.by

    async def scenario():
        batcher = Batcher(latents_fn=fake_latents)
        gate, decoder, first = await held_decode(batcher, request(1, 9.0))
        tasks = [asyncio.create_task(batcher.decode(decoder, request(2, v), Scale(10)))
                 for v in (1.0, 2.0)]
        await until(lambda: batcher.depth == 2)
        gate.set()
        await first
        assert [(await t).tolist() for t in tasks] == [[10.0, 10.0], [20.0, 20.0]]
        await batcher.stop()

    asyncio.run(scenario())


def test_stop_fails_the_waiting_requests_and_finishes_the_decoding_one():
    async def scenario():
        batcher = Batcher(latents_fn=fake_latents)
        gate, decoder, decoding = await held_decode(batcher, request(2, 1.0))
        waiting = asyncio.create_task(batcher.decode(decoder, request(2, 2.0)))
        await until(lambda: batcher.depth == 1)
        stopping = asyncio.create_task(batcher.stop())
        with pytest.raises(Stopped):
            await waiting
        gate.set()
        await stopping
        assert (await decoding).shape == (2, 28, 28)

    asyncio.run(scenario())


def test_batch_latents_equal_request_latents_bit_for_bit():
    seeds = (0, 2**31, 2**32 - 1, 12345)
    requests = [LatentRequest(seed, digits, n, temperature)
                for seed, temperature in zip(seeds, (1.0, 0.3, 1.7, 0.05))
                for digits in ((7,), tuple(range(10)))
                for n in (1, 17)]
    for latent_request, (z, labels) in zip(requests, batch_latents(requests, 4)):
        expected_z, expected_labels = request_latents(*latent_request[:3], noise_width=4,
                                                      temperature=latent_request.temperature)
        assert z.dtype == expected_z.dtype and np.array_equal(z, expected_z), latent_request
        assert np.array_equal(labels, expected_labels)
