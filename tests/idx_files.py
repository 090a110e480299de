"""IDX test files: random splits written as the four standard files, and one-line error checks."""

import numpy as np

from cvae.data.idx import IDX_FILES, write_idx


def random_split(rng, n, labels_high=10):
    """images: uint8[n, 28, 28], labels: uint8[n]."""
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, labels_high, size=n).astype(np.uint8)
    return images, labels


def write_four(directory, train_n=6, test_n=4, suffix="", seed=0):
    """Writes the four IDX files into `directory` and returns the arrays in IDX_FILES order."""
    rng = np.random.default_rng(seed)
    arrays = [*random_split(rng, train_n), *random_split(rng, test_n)]
    for name, array in zip(IDX_FILES, arrays, strict=True):
        write_idx(directory / f"{name}{suffix}", array)
    return arrays


def assert_one_line_error(excinfo, *parts):
    message = str(excinfo.value)
    assert "\n" not in message
    for part in parts:
        assert str(part) in message


def assert_dataset_matches(dataset, arrays, name="mnist"):
    train_images, train_labels, test_images, test_labels = arrays
    assert dataset.name == name
    assert dataset.train_images.dtype == np.uint8 and dataset.test_images.dtype == np.uint8
    assert dataset.train_labels.dtype == np.int32 and dataset.test_labels.dtype == np.int32
    np.testing.assert_array_equal(dataset.train_images, train_images)
    np.testing.assert_array_equal(dataset.train_labels, train_labels)
    np.testing.assert_array_equal(dataset.test_images, test_images)
    np.testing.assert_array_equal(dataset.test_labels, test_labels)
