"""Datasets of any shape for tests: a `DatasetSpec` registered in this process only, and tiny
synthetic images of its shape whose class is visible (NumPy only).

Class c lights row c mod height (and, in colour, tints it by the class), on grey-level noise,
so a model conditioned on the label has something to learn and the pixels use many levels.
"""

from __future__ import annotations

import numpy as np

from cvae.data import specs
from cvae.data.load import Dataset


def shaped_spec(name: str, height: int, width: int, channels: int,
                classes: int) -> specs.DatasetSpec:
    """A spec of the given shape and `classes` classes named c0, c1, ..."""
    return specs.DatasetSpec(name, name, name, height, width, channels,
                             tuple(f"c{i}" for i in range(classes)), source=None)


def register(monkeypatch, spec: specs.DatasetSpec) -> specs.DatasetSpec:
    """Make `spec` a dataset the config and `spec_of` know (`specs.register`), for this test
    only: the process's registry is a fresh one until the test ends."""
    monkeypatch.setattr(specs, "_REGISTERED", {})
    return specs.register(spec)


def shaped_images(spec: specs.DatasetSpec, labels: np.ndarray, seed: int = 0) -> np.ndarray:
    """uint8[N, *spec.stored_shape]: noise in 0..80, row (label mod height) bright (tinted by
    the label in colour)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 80, size=(len(labels), spec.height, spec.width, spec.channels),
                          dtype=np.uint8)
    for i, label in enumerate(labels):
        tint = 255 - 60 * ((label + np.arange(spec.channels)) % 3)
        images[i, label % spec.height] = tint
    return images.reshape(len(labels), *spec.stored_shape)


def shaped_dataset(spec: specs.DatasetSpec, num_train: int, num_test: int = 16,
                   seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    train = rng.integers(0, spec.num_classes, num_train).astype(np.int32)
    test = rng.integers(0, spec.num_classes, num_test).astype(np.int32)
    return Dataset(shaped_images(spec, train, seed), train, shaped_images(spec, test, seed + 1),
                   test, spec.name)
