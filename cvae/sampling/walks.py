"""Walks through the model's latent space, for `GET /interpolate`.

Two walks, both made of `/sample`'s own latents: z of seed s and digit d is the code that the
first picture of `/sample?digit=d&seed=s` decodes (its prior draw, mapped through the model's
prior: `Sampler.to_codes`), so their ends are the pictures `/sample` gives (bit for bit with the
standard prior; with a mixture prior the code is computed in its own program, which may round
differently in the last bits; a ladder's code is its draw's top layer, decoded with the layers
below at their means, so its ends are /sample's pictures without the lower layers' detail):

- `LatentWalk`: for each digit, `steps` codes from z(seed, d) to z(to_seed, d), the direction
  turning at a constant rate and the length changing linearly (spherical interpolation: under a
  Gaussian prior a straight line would pass through unlikely, too-short z in the middle, which
  decode to faint average digits; White 2016, "Sampling generative networks"). Row d starts
  with /sample's seed picture and ends with its to_seed picture.
- `DigitWalk`: keeps each of the n codes of `/sample?digit=d&seed=s&n=n` and decodes it with
  each of its `digits` (the service's: every class of the model, `Sampler.classes`), carried to
  each class's region first, as a transfer does (`Sampler.swap`): one row per z, the same
  "hand" in every class. Column d is /sample's picture when `digits` is every class.

The walks are codes (`cvae.sampling.sampler.Codes`), decoded as they are: walking the prior's noise
instead would, with a mixture prior, jump between its components along the way.

Synopsis:

    [codes] = walk_latents([LatentWalk(seed=1, to_seed=2, digits=(7,), steps=10,
                                       temperature=1.0)], sampler)
    [codes] = walk_latents([DigitWalk(seed=1, digit=7, n=4, temperature=1.0,
                                      digits=sampler.classes)], sampler)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cvae.sampling.sampler import Sampler
from cvae.sampling.latents import Codes, LatentRequest, batch_latents


class LatentWalk(NamedTuple):
    seed: int
    to_seed: int
    digits: tuple[int, ...]  # one row per digit
    steps: int  # points per row, both ends included
    temperature: float

    @property
    def rows(self) -> int:
        return len(self.digits) * self.steps


class DigitWalk(NamedTuple):
    seed: int
    digit: int  # whose /sample latents are kept
    n: int  # latents, one row each
    temperature: float
    # The labels each latent is decoded as: every class of the model is `Sampler.classes`
    # (no default: only the model knows its classes).
    digits: tuple[int, ...]

    @property
    def rows(self) -> int:
        return self.n * len(self.digits)


def slerp(a: np.ndarray, b: np.ndarray, steps: int) -> np.ndarray:
    """f32[L], f32[L] -> f32[steps, L] from a to b (ends exactly a and b): the direction turns
    at a constant rate along the great circle, the length goes linearly from |a| to |b|; the
    straight line when a and b are parallel or zero."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    t = np.linspace(0.0, 1.0, steps)[:, None]
    norm_a, norm_b = np.linalg.norm(a64), np.linalg.norm(b64)
    if min(norm_a, norm_b) < 1e-12:
        path = (1 - t) * a64 + t * b64
    else:
        unit_a, unit_b = a64 / norm_a, b64 / norm_b
        omega = np.arccos(np.clip(unit_a @ unit_b, -1.0, 1.0))
        if np.sin(omega) < 1e-6:
            path = (1 - t) * a64 + t * b64
        else:
            direction = (np.sin((1 - t) * omega) * unit_a
                         + np.sin(t * omega) * unit_b) / np.sin(omega)
            path = direction * ((1 - t) * norm_a + t * norm_b)
    path = path.astype(np.float32)
    path[0], path[-1] = a, b
    return path


def walk_latents(walks: list[LatentWalk | DigitWalk], sampler: Sampler) -> list[Codes]:
    """Codes(z f32[rows, L], labels i32[rows]) for each walk: the draws in one `batch_latents`
    call, mapped to codes in one `Sampler.to_codes` call."""
    draws = []
    for walk in walks:
        if isinstance(walk, LatentWalk):
            draws += [LatentRequest(walk.seed, walk.digits, 1, walk.temperature),
                      LatentRequest(walk.to_seed, walk.digits, 1, walk.temperature)]
        else:
            draws.append(LatentRequest(walk.seed, (walk.digit,), walk.n, walk.temperature))
    drawn = batch_latents(draws, sampler.noise_dim)
    noise = np.concatenate([z for z, _ in drawn])
    codes = sampler.to_codes(noise, np.concatenate([labels for _, labels in drawn]))
    parts = iter(np.split(codes, np.cumsum([len(z) for z, _ in drawn])[:-1]))
    results = []
    for walk in walks:
        if isinstance(walk, LatentWalk):
            starts, ends = next(parts), next(parts)
            z = np.concatenate([slerp(a, b, walk.steps) for a, b in zip(starts, ends)])
            labels = np.repeat(np.asarray(walk.digits, np.int32), walk.steps)
        else:
            labels = np.tile(np.asarray(walk.digits, np.int32), walk.n)
            z = sampler.swap(np.repeat(next(parts), len(walk.digits), axis=0), walk.digit, labels)
        results.append(Codes(z, labels))
    return results
