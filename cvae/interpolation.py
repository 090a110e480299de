"""Walks through the model's latent space, for `GET /interpolate`.

Two walks, both made of `/sample`'s own latents (z of seed s and digit d is the first row that
`/sample?digit=d&seed=s` draws), so their ends are pictures `/sample` gives too:

- `LatentWalk`: for each digit, `steps` points on the great circle from z(seed, d) to
  z(to_seed, d) (spherical interpolation: under a Gaussian prior a straight line would pass
  through unlikely, too-short z in the middle, which decode to faint average digits; White 2016,
  "Sampling generative networks"). Row d starts with /sample's seed picture and ends with its
  to_seed picture.
- `DigitWalk`: keeps each of the n latents that `/sample?digit=d&seed=s&n=n` draws and decodes
  it with every digit 0-9: one row per z, the same "hand" in all ten digits. Column d is
  /sample's picture.

Synopsis:

    [(z, labels)] = walk_latents([LatentWalk(seed=1, to_seed=2, digits=(7,), steps=10,
                                             temperature=1.0)], latent_dim)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cvae.sampling import DIGITS, LatentRequest, batch_latents


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

    @property
    def rows(self) -> int:
        return self.n * len(DIGITS)


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


def walk_latents(walks: list[LatentWalk | DigitWalk], latent_dim: int
                 ) -> list[tuple[np.ndarray, np.ndarray]]:
    """(z f32[rows, L], labels i32[rows]) for each walk; the draws in one `batch_latents` call."""
    draws = []
    for walk in walks:
        if isinstance(walk, LatentWalk):
            draws += [LatentRequest(walk.seed, walk.digits, 1, walk.temperature),
                      LatentRequest(walk.to_seed, walk.digits, 1, walk.temperature)]
        else:
            draws.append(LatentRequest(walk.seed, (walk.digit,), walk.n, walk.temperature))
    drawn = iter(batch_latents(draws, latent_dim))
    results = []
    for walk in walks:
        if isinstance(walk, LatentWalk):
            (starts, _), (ends, _) = next(drawn), next(drawn)
            z = np.concatenate([slerp(a, b, walk.steps) for a, b in zip(starts, ends)])
            labels = np.repeat(np.asarray(walk.digits, np.int32), walk.steps)
        else:
            kept, _ = next(drawn)
            z = np.repeat(kept, len(DIGITS), axis=0)
            labels = np.tile(np.asarray(DIGITS, np.int32), walk.n)
        results.append((z, labels))
    return results
