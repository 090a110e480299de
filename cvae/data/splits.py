"""The training set split into what the model learns from and what selects among checkpoints.

Model selection (the best checkpoint, early stopping, the NaN guard's evaluation) must never see
the test set, or the test figures are no longer held out. MNIST's source carries its own
validation set: the IDX training file holds the source's 50,000 training images followed by its
10,000 validation images, so the validation set is the last `validation_size` images (1,000 by
default; 10,000 is exactly the source's). Other datasets have no such split: their validation
images are a fixed random choice keyed by the run's seed. The choice uses a counter-based hash
(splitmix64) in NumPy, so it depends on nothing but (seed, index, size): not on the JAX or
NumPy version, nor on how batches are fed. No JAX here.

With `--labels N` (semi-supervised), N class-balanced examples of the training part keep their
labels (`labelled_indices`), chosen by the same hash on a salted seed, so the choice is fixed by
(seed, index) and disjoint from the validation examples by construction.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cvae.config.sections import Config, ConfigError

# Datasets whose training file ends with the source's own validation set.
SOURCE_VALIDATION_LAST = ("mnist",)


@dataclasses.dataclass(frozen=True)
class TrainValidation:
    """train_images: uint8[N, 28, 28], train_labels: int32[N]; the same for validation [M].

    train_indices: int64[N], each training example's index in the training file."""

    train_images: np.ndarray
    train_labels: np.ndarray
    validation_images: np.ndarray
    validation_labels: np.ndarray
    train_indices: np.ndarray | None = None


def splitmix64(values: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, elementwise on uint64: a fixed, well-mixed integer hash."""
    z = np.asarray(values, np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _hash_keys(seed: int, indices: np.ndarray, salt: int = 0) -> np.ndarray:
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps by design
        return splitmix64(splitmix64(np.uint64(seed) ^ np.uint64(salt))
                          ^ np.asarray(indices, np.uint64))


# Salts the labelled set's hash so it is not the validation choice's order again.
_LABELLED_SALT = 0x5EED_1ABE_11ED


def validation_indices(num_examples: int, validation_size: int, *, dataset: str,
                       seed: int) -> np.ndarray:
    """Sorted indices of the validation examples among `num_examples` training examples."""
    if not 1 <= validation_size < num_examples:
        raise ConfigError(f"validation_size={validation_size}: must be in [1, {num_examples - 1}] "
                          f"for a training file of {num_examples} examples")
    if dataset in SOURCE_VALIDATION_LAST:
        return np.arange(num_examples - validation_size, num_examples)
    return seeded_choice(np.arange(num_examples), validation_size, seed=seed)


def seeded_choice(indices: np.ndarray, count: int, *, seed: int, salt: int = 0) -> np.ndarray:
    """The `count` of `indices` whose hash under (seed, salt) is lowest, sorted: a fixed random
    choice that depends on (seed, salt, index) alone."""
    indices = np.asarray(indices)
    keys = _hash_keys(seed, indices, salt)
    return np.sort(indices[np.argsort(keys, kind="stable")[:count]])


# Salts the test split's hash (a prepared data set's), so it is not the validation choice's.
TEST_SALT = 0x7E57_5E7


def seeded_test_split(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """bool[N]: in each class, the `fraction` of its members whose hash of (seed, index) is
    lowest, rounded, and never all of them (every class keeps a training member)."""
    test = np.zeros(len(labels), bool)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        count = min(round(len(members) * fraction), len(members) - 1)
        test[seeded_choice(members, count, seed=seed, salt=TEST_SALT)] = True
    return test


def training_size(num_examples: int, config: Config) -> int:
    """How many of a training file's `num_examples` the model trains on."""
    trained = num_examples - config.data.validation_size
    return min(trained, config.data.train_limit) if config.data.train_limit else trained


def split_training_set(images: np.ndarray, labels: np.ndarray,
                       config: Config) -> TrainValidation:
    """Split the training file's examples; `config.data.train_limit` then cuts the training part."""
    held_out = validation_indices(len(images), config.data.validation_size,
                                  dataset=config.data.dataset,
                                  seed=config.run.seed)
    keep = np.ones(len(images), bool)
    keep[held_out] = False
    train = np.flatnonzero(keep)
    if config.data.train_limit:
        train = train[:config.data.train_limit]
    return TrainValidation(images[train], labels[train], images[held_out], labels[held_out],
                           train)


def labelled_indices(train_labels: np.ndarray, file_indices: np.ndarray, *, count: int,
                     num_classes: int, seed: int) -> np.ndarray:
    """Sorted positions (into the training part) of the `count` examples that keep their labels:
    for each class, the `count / num_classes` of its examples whose file index hashes lowest
    under (seed, index). Raises ConfigError when a class has too few examples."""
    per_class = count // num_classes
    keys = _hash_keys(seed, file_indices, _LABELLED_SALT)
    chosen = []
    for label in range(num_classes):
        members = np.flatnonzero(np.asarray(train_labels) == label)
        if len(members) < per_class:
            raise ConfigError(f"labels={count}: class {label} has only {len(members)} training "
                              f"examples, {per_class} needed (lower --labels)")
        chosen.append(members[np.argsort(keys[members], kind="stable")[:per_class]])
    return np.sort(np.concatenate(chosen))
