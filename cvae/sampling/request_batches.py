"""The latents and labels of a batch of mixed requests, computed together before one decode.

The service's batcher (service/batching.py) gathers whatever requests arrive together: prior
samples (`cvae.sampling.sampler.LatentRequest`), latent walks (`cvae.sampling.walks`) and style
transfers (`cvae.sampling.transfer.TransferRequest`, which need the encoder). `request_rows`
computes each kind's rows in one call per kind, in the batcher's worker thread; the batcher then
decodes all prior draws in one `Sampler.decode` and all codes (`cvae.sampling.sampler.Codes`:
transfers' posterior latents and walks' points) in one `Sampler.decode_codes`. Every step is
row-wise, so a request's pixels do not depend on what it was batched with.
"""

from __future__ import annotations

from typing import Callable

from cvae.sampling.walks import DigitWalk, LatentWalk, walk_latents
from cvae.sampling.sampler import Sampler
from cvae.sampling.latents import LatentRequest, batch_latents
from cvae.sampling.transfer import TransferRequest, transfer_latents

# kind -> (requests of that kind, sampler) -> one (z, labels) or Codes per request
ROWS_BY_KIND: dict[type, Callable] = {
    LatentRequest: lambda requests, sampler: batch_latents(requests, sampler.noise_dim),
    LatentWalk: walk_latents,
    DigitWalk: walk_latents,
    TransferRequest: transfer_latents,
}


def request_rows(requests: list, sampler: Sampler) -> list[tuple]:
    """One (z f32[rows, noise_dim], labels i32[rows]) of prior draws per request, in order, or for a
    walk or transfer its `Codes` (a transfer's also carry the label its image was encoded
    with)."""
    kinds: dict[type, list[int]] = {}
    for index, request in enumerate(requests):
        kinds.setdefault(type(request), []).append(index)
    if len(kinds) == 1 and LatentRequest in kinds:  # the common case: /sample only
        return batch_latents(requests, sampler.noise_dim)
    results: list = [None] * len(requests)
    for kind, members in kinds.items():
        rows = ROWS_BY_KIND[kind]([requests[i] for i in members], sampler)
        for index, value in zip(members, rows):
            results[index] = value
    return results
