"""Tiny synthetic digit-like data: class d lights up a band of rows, so labels matter.

The one synthetic dataset of the project, for tests, smoke runs and the benchmarks' quick mode:
learnable in a few steps, made in milliseconds, no files needed. NumPy only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cvae.data.load import Dataset, raw_dir_of
from cvae.data.idx import TEST_IMAGES, TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS, write_idx
from cvae.data.specs import MNIST


def synthetic_images(labels: np.ndarray, seed: int = 0) -> np.ndarray:
    """uint8[N, 28, 28]: a bright band at rows 2d+4 .. 2d+8 for label d, on faint noise."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 40, size=(len(labels), *MNIST.stored_shape), dtype=np.uint8)
    for i, digit in enumerate(labels):
        images[i, 2 * digit + 4:2 * digit + 8, 4:24] = rng.integers(200, 256, size=(4, 20))
    return images


def synthetic_dataset(num_train: int = 256, num_test: int = 64, seed: int = 0) -> Dataset:
    """Random labels, images from `synthetic_images`; train and test drawn independently."""
    rng = np.random.default_rng(seed)
    train_labels = rng.integers(0, 10, num_train).astype(np.int32)
    test_labels = rng.integers(0, 10, num_test).astype(np.int32)
    return Dataset(synthetic_images(train_labels, seed), train_labels,
                   synthetic_images(test_labels, seed + 1), test_labels, "mnist")


def write_synthetic_idx(data_dir: Path, num_train: int = 256, num_test: int = 64) -> Dataset:
    """The synthetic set as the four standard IDX files under data_dir/MNIST/raw."""
    data = synthetic_dataset(num_train, num_test)
    raw = raw_dir_of(data_dir, "mnist")
    write_idx(raw / TRAIN_IMAGES, data.train_images)
    write_idx(raw / TRAIN_LABELS, data.train_labels)
    write_idx(raw / TEST_IMAGES, data.test_images)
    write_idx(raw / TEST_LABELS, data.test_labels)
    return data
