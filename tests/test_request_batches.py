"""cvae/sampling/request_batches.py: a batch of mixed requests gets each request's own rows."""

from __future__ import annotations

import numpy as np

from cvae.sampling.request_batches import request_rows
from cvae.sampling.walks import DigitWalk, LatentWalk
from cvae.sampling.sampler import load_sampler
from cvae.sampling.latents import LatentRequest
from cvae.sampling.transfer import TransferRequest


def test_mixed_kinds_in_one_batch_get_the_rows_they_get_alone(trained_run):
    sampler = load_sampler(trained_run.directory)
    image = trained_run.data.test_images[0]
    every = sampler.classes
    requests = [LatentRequest(1, (7,), 16, 1.0), TransferRequest(image, None, every, 2, 5),
                LatentWalk(1, 2, (3,), 5, 1.0), LatentRequest(2, every, 3, 0.5),
                DigitWalk(4, 1, 2, 1.0, sampler.classes), TransferRequest(image, 3, (1, 2), 0, 0)]
    together = request_rows(requests, sampler)
    kinds = [len(rows) for rows in together]
    assert kinds == [2, 3, 3, 2, 3, 3]  # prior draws, or Codes (a transfer's with its label)
    for request, rows in zip(requests, together):
        [alone] = request_rows([request], sampler)
        assert len(rows[0]) == request.rows
        assert all(np.array_equal(a, b) for a, b in zip(rows, alone))
