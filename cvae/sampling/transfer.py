"""Handwriting style transfer: encode a digit someone wrote, decode its z with other labels.

A conditional VAE separates class (y) from style (z): the posterior q(z | x, y) of a digit x,
decoded with label b, draws "x's hand" writing b (the analogies of Kingma et al. 2014). The
encoder needs the label of x; when it is not given, the model picks it itself: with the
classifier q(y|x) of a model trained with `--labels N`, its most probable label; otherwise the
label whose -ELBO(x, y) at the posterior mean is lowest (a generative classifier; 98% right on
MNIST's test digits with the default checkpoint).

Synopsis:

    request = TransferRequest(image, label=None, digits=sampler.classes, samples=0, seed=0)
    [codes] = transfer_latents([request], sampler)   # then sampler.decode_codes(*codes[:2])

`samples=0` uses the posterior mean (one row); `samples=k` draws k z ~ q(z | x, y) with `seed`.
Rows are draw-major: for each z, every digit in `digits`, the code carried to that digit's
region first when the model's prior differs per class (`Sampler.swap`, cvae/model/transport.py).
Every step is row-wise (the encoder runs in the sampler's fixed blocks), so a request's values
never depend on its batch.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cvae.data.pixels import to_unit
from cvae.sampling.sampler import Sampler
from cvae.sampling.latents import Codes, LatentRequest, batch_latents


class TransferRequest(NamedTuple):
    image: np.ndarray  # uint8[h, w] of the model's spec, light digit on black (prepare_digit)
    label: int | None  # the digit the image shows; None: the label with the best ELBO
    digits: tuple[int, ...]  # the labels to decode with, in order
    samples: int  # 0: the posterior mean; k: k posterior draws
    seed: int  # for the draws (unused with samples=0)

    @property
    def rows(self) -> int:
        """Images decoded for it."""
        return len(self.digits) * max(1, self.samples)


def read_labels(requests: list[TransferRequest], sampler: Sampler) -> list[TransferRequest]:
    """The requests with their missing labels read by q(y|x) (all in one call of the
    sampler's fixed blocks), when the model has a classifier; else as they are (a model trained
    with every label: the lowest -ELBO picks, `transfer_latents`)."""
    unread = [i for i, r in enumerate(requests) if r.label is None]
    if not sampler.has_classifier or not unread:
        return requests
    read = np.argmax(sampler.classify(np.stack([requests[i].image for i in unread])), axis=-1)
    requests = list(requests)
    for i, label in zip(unread, read):
        requests[i] = requests[i]._replace(label=int(label))
    return requests


def transfer_latents(requests: list[TransferRequest], sampler: Sampler) -> list[Codes]:
    """Codes(z f32[rows, L], labels i32[rows], the label the image was encoded with) per
    request: posterior latents, to decode with `Sampler.decode_codes`.

    One encoder call for the whole batch: an unlabelled image is encoded with every label
    of the model's classes
    and scored; a labelled one once.
    """
    requests = read_labels(requests, sampler)
    candidates = [sampler.classes if r.label is None else (r.label,) for r in requests]
    images = np.stack([r.image for r, labels in zip(requests, candidates) for _ in labels])
    labels = np.concatenate([np.asarray(c, np.int32) for c in candidates])
    mean, logvar, neg_elbo = sampler.encode(images, labels)
    picks, start = [], 0
    for labels_tried in candidates:
        picks.append(start + int(np.argmin(neg_elbo[start:start + len(labels_tried)])))
        start += len(labels_tried)
    chosen = [int(labels[i]) for i in picks]
    sampled = [i for i, r in enumerate(requests) if r.samples > 0]
    noise = dict(zip(sampled, batch_latents(
        [LatentRequest(requests[i].seed, (chosen[i],), requests[i].samples, 1.0)
         for i in sampled], sampler.code_dim)))
    results = []
    for i, request in enumerate(requests):
        z = mean[picks[i]][None]
        if i in noise:  # z = mean + sigma * eps, eps ~ N(0, I) from (seed, label)
            z = z + np.exp(np.float32(0.5) * logvar[picks[i]])[None] * noise[i][0]
        row_labels = np.tile(np.asarray(request.digits, np.int32), len(z))
        rows = sampler.swap(np.repeat(z, len(request.digits), axis=0), chosen[i], row_labels)
        results.append(Codes(rows, row_labels, chosen[i]))
    return results


def transfer_tiles(images: np.ndarray, request: TransferRequest, *, show_input: bool) -> np.ndarray:
    """Decoded rows f32[rows, h, w] -> the grid's tiles: each draw's row of digits, led by
    the prepared input when `show_input` (so a default-width row is [input, d0, d1, ...])."""
    if not show_input:
        return images
    width = len(request.digits)
    shape = request.image.shape
    rows = images.reshape(-1, width, *shape)
    first = np.broadcast_to(to_unit(request.image), (len(rows), 1, *shape))
    return np.concatenate([first, rows], axis=1).reshape(-1, *shape)

