"""The sampler's bit-identity claims, checked on whatever CPU kernels run this process.

Every claim is "a request's values are the same bits alone or batched with others": prior
draws, decode, decode of codes, the prior's mapping, encode, transfers, walks, and the PNG
bytes (which must read back as their pixels under these kernels too: ISA-L's deflate picks its
kernels from the CPU's features as XLA does). `check_sampler` checks them all for a sampler
built as the service builds it, with every row position of every block size the sampler kept
(a batch of exactly that many rows, cycling through the test rows, puts a test row at every
position). tests/test_bit_identity.py runs it in the test process, and as

    python tests/bit_identity.py CHECKPOINT_DIR

in subprocesses under other CPU kernels (XLA flags, or valgrind's emulated CPU), where it
prints one line per check and exits 1 on the first failure.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from cvae.sampling.grid import encoder_signature, make_grid, png_bytes
from cvae.sampling.walks import DigitWalk, LatentWalk, walk_latents
from cvae.sampling.sampler import Sampler, load_sampler
from cvae.sampling.latents import LatentRequest, batch_latents
from cvae.sampling.grid import grid_columns
from cvae.sampling.latents import request_latents
from cvae.data.synthetic import synthetic_images
from cvae.sampling.transfer import TransferRequest, transfer_latents

DIGITS = tuple(range(10))  # the synthetic digits' classes: the checks run on models of them
# Requests of several sizes (n not a power of two too), seeds and temperatures.
SAMPLE_REQUESTS = [LatentRequest(seed, digits, n, temperature) for seed, digits, n, temperature in
                   [(0, (7,), 1, 1.0), (1, (3,), 5, 0.7), (2**32 + 5, DIGITS, 3, 1.3),
                    (9, (0, 9), 17, 1.0), (123456, (4,), 64, 0.5), (77, DIGITS, 16, 1.0)]]


def assert_same_bits(got, expected, what: str) -> None:
    for a, b in zip(got, expected, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.tobytes() != b.tobytes():
            raise AssertionError(f"{what}: other bits batched than alone")


def assert_rows_independent(fn: Callable, inputs: tuple[np.ndarray, ...], sizes) -> None:
    """fn(*inputs) row i == fn(*inputs[i:i+1]) for every test row, and for batches of every
    size in `sizes` made by cycling through the test rows (every position of that block)."""
    alone = [fn(*(x[i:i + 1] for x in inputs)) for i in range(len(inputs[0]))]
    name = getattr(fn, "__name__", repr(fn))
    for size in sorted({len(inputs[0]), *sizes}):
        cycle = np.arange(size) % len(inputs[0])
        batched = fn(*(x[cycle] for x in inputs))
        for position, row in enumerate(cycle):
            single = alone[row]
            if isinstance(single, tuple):
                assert_same_bits([part[position] for part in batched],
                                 [part[0] for part in single],
                                 f"{name} row at position {position} of {size}")
            else:
                assert_same_bits([batched[position]], [single[0]],
                                 f"{name} row at position {position} of {size}")


def check_latents() -> None:
    """batch_latents gives each request the bits request_latents gives it alone."""
    for latent_dim in (4, 32):
        together = batch_latents(SAMPLE_REQUESTS, latent_dim)
        for request, batched in zip(SAMPLE_REQUESTS, together):
            assert_same_bits(batched, request_latents(*request[:2], request.n,
                                                      noise_width=latent_dim,
                                                      temperature=request.temperature),
                             f"latents {request}")


def check_rows(sampler: Sampler) -> None:
    """decode, decode_codes, to_codes, encode and classify are row-wise at every kept block
    position."""
    sizes = [s for s in sampler.block_sizes if s > 1]
    code_sizes = [s for s in sampler.code_block_sizes if s > 1]  # checked on their own
    z, labels = (np.concatenate(part) for part in zip(*batch_latents(SAMPLE_REQUESTS[:4],
                                                                      sampler.noise_dim)))
    z, labels = z[:40], labels[:40]
    assert_rows_independent(sampler.decode, (z, labels), sizes)
    for fn in (sampler.decode_codes, sampler.to_codes):
        assert_rows_independent(fn, (z, labels), code_sizes)
    images = synthetic_images(np.arange(24) % 10, seed=3)
    assert_rows_independent(sampler.encode, (images, (np.arange(24) * 7 % 10).astype(np.int32)),
                            code_sizes)
    if sampler.classify_fn is not None:
        assert_rows_independent(sampler.classify, (images,),
                                [s for s in sampler.classify_block_sizes if s > 1])


def check_requests(sampler: Sampler) -> None:
    """Seeded sample requests, transfers and walks: batched (in both orders) == alone, and a
    sample request's PNG bytes too."""
    alone = [sampler.decode(*batch_latents([r], sampler.noise_dim)[0]) for r in SAMPLE_REQUESTS]
    for order in (SAMPLE_REQUESTS, SAMPLE_REQUESTS[::-1]):
        rows = batch_latents(order, sampler.noise_dim)
        decoded = sampler.decode(*(np.concatenate(part) for part in zip(*rows)))
        parts = np.split(decoded, np.cumsum([r.rows for r in order])[:-1])
        for request, part in zip(order, parts):
            expected = alone[SAMPLE_REQUESTS.index(request)]
            assert_same_bits([part], [expected], f"decode of {request}")
            digit = request.digits[0] if len(request.digits) == 1 else None
            cols = grid_columns(digit, request.n, None)
            png = png_bytes(make_grid(part, cols))
            assert_same_bits([png], [png_bytes(make_grid(expected, cols))], f"PNG of {request}")
            with Image.open(io.BytesIO(png)) as read:  # the encoder's kernels here: a valid PNG
                assert_same_bits([np.asarray(read)], [make_grid(expected, cols)],
                                 f"pixels read back from the PNG of {request}")
    images = synthetic_images(np.arange(12) % 10, seed=5)
    transfers = [TransferRequest(images[i], None if i % 2 else i % 10, DIGITS[:1 + i % 10],
                                 i % 3, i) for i in range(12)]
    walks = [LatentWalk(1, 2, (7,), 10, 1.0), LatentWalk(3, 9, DIGITS, 5, 0.8),
             DigitWalk(4, 2, 6, 1.0, DIGITS), DigitWalk(5, 8, 1, 1.2, DIGITS)]
    for compute, requests in ((transfer_latents, transfers), (walk_latents, walks)):
        together = compute(requests, sampler)
        for request, batched in zip(requests, together):
            [single] = compute([request], sampler)
            assert_same_bits(batched, single, f"{compute.__name__} of {request[1:]}")
        codes = [np.concatenate(part) for part in zip(*[c[:2] for c in together])]
        decoded = np.split(sampler.decode_codes(*codes),
                           np.cumsum([len(c.z) for c in together])[:-1])
        for part, batched in zip(decoded, together):
            assert_same_bits([part], [sampler.decode_codes(*batched[:2])],
                             f"decoded {compute.__name__} rows")


def check_sampler(sampler: Sampler, report: Callable[[str], None] = lambda line: None) -> None:
    check_latents()
    report("ok check_latents")
    for check in (check_rows, check_requests):
        check(sampler)
        report(f"ok {check.__name__} (blocks {sampler.block_sizes}, "
               f"dropped {sampler.dropped_blocks}; code blocks {sampler.code_block_sizes}, "
               f"dropped {sampler.dropped_code_blocks}; classify blocks "
               f"{sampler.classify_block_sizes}, dropped {sampler.dropped_classify_blocks})")


def main(directory: str) -> int:
    sampler = load_sampler(Path(directory))  # as service/checkpoints.py loads it
    print(f"kernel signature {sampler.kernel_signature.hex()}", flush=True)
    print(f"PNG encoder signature {encoder_signature().hex()}", flush=True)
    try:
        check_sampler(sampler, print)
    except AssertionError as error:
        print(f"FAILED: {error}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
