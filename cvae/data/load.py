"""Loading a labelled dataset into memory: a built-in one from IDX files or torchvision, one's
own from its prepared files (`cvae.data.prepared`).

`load_dataset` finds the four standard IDX files (`cvae.data.idx`) under `data/<Folder>/raw/` -- the
layout `torchvision.datasets` reads, written by `cvae.data.prepare` -- or reads the same folders
through `torchvision.datasets` (the `torch` extra), and checks shapes, counts and label range
against the dataset's spec (`cvae.data.specs`), so a bad file fails with one line naming it.
No JAX here.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from cvae.config.sections import DataSection
from cvae.config.settings import choices, hints
from cvae.errors import DataError
from cvae.data.idx import (IDX_FILES, TEST_IMAGES, TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS,
                           find_idx_files, read_idx)
from cvae.data.prepared import load_arrays
from cvae.data.specs import DatasetSpec, spec_of

_ERROR_HINT = "run `cvae data` (or `make train`)"


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A labelled image dataset held in memory, in the shapes of its spec (`spec_of(name)`):

    train_images: uint8[N, *stored_shape]; train_labels: int32[N] in 0..num_classes - 1;
    test_images: uint8[M, *stored_shape]; test_labels: int32[M] likewise.
    """

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    name: str


def check_choice(field: str, value: str) -> None:
    """ValueError unless `value` is one of the data section's `field`'s choices ("source")."""
    allowed = choices(hints(DataSection)[field])
    if value not in allowed:
        raise ValueError(f"unknown data {field.replace('_', ' ')} {value!r}; "
                         f"allowed: {', '.join(allowed)}")


def raw_dir_of(data_dir: str | os.PathLike, name: str) -> Path:
    """Where dataset `name`'s IDX files live under `data_dir` (torchvision's layout)."""
    return Path(data_dir) / spec_of(name).folder / "raw"


def _check_split(images: np.ndarray, labels: np.ndarray, *, spec: DatasetSpec, images_at: str,
                 labels_at: str) -> None:
    """Raises DataError unless images: uint8[N, *spec.stored_shape] and labels: [N] in
    0..spec.num_classes - 1."""
    shape = spec.stored_shape
    if images.shape[1:] != shape:
        expected = ", ".join(["N", *map(str, shape)])
        raise DataError(f"{images_at}: expected images of shape [{expected}], "
                        f"found {images.shape}")
    if labels.ndim != 1:
        raise DataError(f"{labels_at}: expected labels of shape [N], found {labels.shape}")
    if len(labels) != len(images):
        raise DataError(
            f"{labels_at}: {len(labels)} labels but {images_at} has {len(images)} images"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= spec.num_classes):
        raise DataError(f"{labels_at}: labels must be 0..{spec.num_classes - 1}, "
                        f"found {labels.min()}..{labels.max()}")


def _load_idx_arrays(data_dir: Path, name: str, *, test: bool
                     ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    searched = [raw_dir_of(data_dir, name), data_dir]
    wanted = IDX_FILES if test else (TRAIN_IMAGES, TRAIN_LABELS)
    for directory in searched:
        files = find_idx_files(directory, wanted)
        if files is not None:
            arrays = {key: read_idx(path) for key, path in files.items()}
            return arrays, {key: str(path) for key, path in files.items()}
    raise DataError(
        f"{name} IDX files ({', '.join(wanted)}, plain or .gz) not found in "
        f"{searched[0]} or {searched[1]}: {_ERROR_HINT}"
    )


def _load_torchvision_arrays(
    data_dir: Path, name: str, *, test: bool
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    try:
        from torchvision import datasets
    except ImportError:
        raise DataError(
            "source 'torchvision' needs the torch extra: pip install -e '.[torch]'"
        ) from None
    folder = spec_of(name).folder
    cls = getattr(datasets, folder)
    arrays, names = {}, {}
    for train, images_key, labels_key in (
        (True, TRAIN_IMAGES, TRAIN_LABELS),
        (False, TEST_IMAGES, TEST_LABELS),
    )[:2 if test else 1]:
        where = f"{raw_dir_of(data_dir, name)} (torchvision {folder}, train={train})"
        try:
            split = cls(root=str(data_dir), train=train, download=False)
        except RuntimeError as e:
            raise DataError(f"{where}: {e}: {_ERROR_HINT}") from None
        arrays[images_key] = np.asarray(split.data.numpy())
        arrays[labels_key] = np.asarray(split.targets.numpy())
        names[images_key] = names[labels_key] = where
    return arrays, names


def load_dataset(
    data_dir: str | os.PathLike = "data", name: str = "mnist", source: str = "idx",
    *, test: bool = True,
) -> Dataset:
    """Loads dataset `name` from `data_dir`.

    name: a built-in dataset (`cvae.data.specs.SPECS`) or a registered one of one's own.
    source "idx" reads a built-in's four IDX files (plain or .gz) from
    `data_dir/<its folder>/raw/`, or from data_dir itself, and one's own prepared files from
    `data_dir/<name>/` (`cvae.data.prepared`); source "torchvision" reads a built-in's folders
    through torchvision.datasets (needs the torch extra).
    Shapes and labels are checked against the spec.
    test=False (training) does not open the test files at all: the Dataset's test arrays are
    empty, and the files need not exist.
    """
    spec = spec_of(name)
    check_choice("source", source)
    if spec.source is None:  # one's own, from `cvae data --from`
        if source != "idx":
            raise DataError(f"dataset {name!r} is read from its prepared files: "
                            f"--data-source idx, not {source}")
        arrays, names = load_arrays(data_dir, spec, test=test)
    else:
        load = _load_idx_arrays if source == "idx" else _load_torchvision_arrays
        arrays, names = load(Path(data_dir), name, test=test)
    if not test:
        arrays[TEST_IMAGES] = np.zeros((0, *spec.stored_shape), np.uint8)
        arrays[TEST_LABELS] = np.zeros(0, np.int32)
        names[TEST_IMAGES] = names[TEST_LABELS] = "(test set not loaded)"
    for images_key, labels_key in ((TRAIN_IMAGES, TRAIN_LABELS), (TEST_IMAGES, TEST_LABELS)):
        _check_split(arrays[images_key], arrays[labels_key], spec=spec,
                     images_at=names[images_key], labels_at=names[labels_key])
    return Dataset(
        train_images=np.asarray(arrays[TRAIN_IMAGES], np.uint8),
        train_labels=np.asarray(arrays[TRAIN_LABELS], np.int32),
        test_images=np.asarray(arrays[TEST_IMAGES], np.uint8),
        test_labels=np.asarray(arrays[TEST_LABELS], np.int32),
        name=name,
    )
