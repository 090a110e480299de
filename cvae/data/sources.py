"""A person's labelled images where they already are: an image folder, an .npz, or IDX files.

`open_source(path)` reads what a source holds without keeping its pixels: class names, one label,
size and mode per image, the split when the source has one, and the files it could not decode.
`Source.image(i)` then gives image i as a Pillow image, one at a time, so `cvae.data.own` can
write any number of them in bounded memory. The layouts are those people already use:

- a folder with one subfolder per class, named after the class (torchvision's `ImageFolder`,
  Keras' `image_dataset_from_directory`), files found recursively in sorted order, any format
  Pillow reads; optionally `train/` and `test/` above the class folders. Hidden files (a name
  starting with ".") are ignored;
- an .npz with `images` uint8 (N, H, W) or (N, H, W, C), C 1 or 3, `labels` (N,) integers and
  optionally `class_names` (K,) strings; without them the classes are "0".."K-1";
- a folder holding the four standard IDX files (`cvae.data.idx`), train and test.
No JAX here.
"""

from __future__ import annotations

import collections
import dataclasses
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError
from tqdm import tqdm

from cvae.data.idx import (IDX_FILES, TEST_IMAGES, TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS,
                           find_idx_files, read_idx)
from cvae.data.memory import check_fits
from cvae.errors import DataError
from cvae.limits import MAX_CLASSES

# Pillow modes that hold grey levels only; any other mode (RGB, RGBA, P, CMYK, ...) is colour.
GREY_MODES = ("1", "L", "LA", "I", "I;16", "I;16L", "I;16B", "I;16N", "F")
# What a file that is not an image, or does not decode, raises inside Pillow.
DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)
SPLIT_FOLDERS = ("train", "test")


@dataclasses.dataclass(frozen=True)
class Bad:
    """A file left out (--skip-bad) or refused, and why."""

    path: str
    reason: str


@dataclasses.dataclass
class Source:
    """What a source holds, its pixels read on demand by `image(i)`.

    labels: int64[N] in 0..len(class_names) - 1; sizes: int64[N, 2] as (height, width);
    modes: the Pillow mode of each image; test: bool[N], True for the source's own test
    images, or None when the source has no split."""

    kind: str  # "folder", "npz" or "idx"
    path: Path
    class_names: tuple[str, ...]
    labels: np.ndarray
    sizes: np.ndarray
    modes: list[str]
    test: np.ndarray | None
    image: Callable[[int], Image.Image]
    where: Callable[[int], str]  # image i's file, or its place in the array, for messages
    bad: list[Bad] = dataclasses.field(default_factory=list)
    # (N, H, W) or (N, H, W, C) uint8 for the array sources: copied as they are when no
    # conversion is asked for; None for a folder.
    array: Callable[[slice], np.ndarray] | None = None

    @property
    def count(self) -> int:
        return len(self.labels)


def open_source(path: str | Path, *, skip_bad: bool = False, progress: bool = True) -> Source:
    """The source at `path`, its kind told by its layout (module docstring); DataError with one
    line naming the path otherwise."""
    path = Path(path)
    if path.is_file() and path.suffix == ".npz":
        return _npz_source(path)
    if not path.is_dir():
        raise DataError(f"{path}: not an image folder, an .npz file or a folder of IDX files")
    if find_idx_files(path) is not None:
        return _idx_source(path)
    return _folder_source(path, skip_bad=skip_bad, progress=progress)


# --- an image folder ---------------------------------------------------------------------

def _visible(name: str) -> bool:
    return not name.startswith(".")


def _class_folders(root: Path) -> tuple[dict[str, Path], list[Path]]:
    """{class name: folder} of `root`'s visible subfolders, and its loose visible files."""
    entries = sorted(entry for entry in root.iterdir() if _visible(entry.name))
    return ({entry.name: entry for entry in entries if entry.is_dir()},
            [entry for entry in entries if not entry.is_dir()])


def _split_levels(root: Path) -> list[tuple[Path, bool]] | None:
    """[(train folder, False), (test folder, True)] when `root` has the train/test level."""
    names = {entry.name for entry in root.iterdir() if entry.is_dir()}
    present = [name for name in SPLIT_FOLDERS if name in names]
    if not present:
        return None
    if len(present) == 1:
        missing = next(name for name in SPLIT_FOLDERS if name not in names)
        raise DataError(f"{root}: has {present[0]}/ but no {missing}/: give both levels, or "
                        f"only class folders (then a seeded split holds out the test set)")
    return [(root / name, name == "test") for name in SPLIT_FOLDERS]


def _folder_files(root: Path
                  ) -> tuple[list[str], list[tuple[Path, int, bool]], list[Bad], bool]:
    """(class names, [(file, label, is test)], what lies outside any class folder, whether
    the folder has the train/test level)."""
    split = _split_levels(root)
    levels = split or [(root, False)]
    folders = [(_class_folders(level), is_test) for level, is_test in levels]
    class_names = sorted({name for (classes, _), _ in folders for name in classes})
    if split:
        train_classes = set(folders[0][0][0])
        extra = sorted(set(class_names) - train_classes)
        if extra:
            raise DataError(f"{root / 'test'}: class folder(s) {', '.join(extra)} have no "
                            f"folder in {root / 'train'}")
    files = []
    # Beside train/ and test/, anything else visible is as misplaced as a file beside classes.
    loose = [Bad(str(entry), "beside train/ and test/") for entry in sorted(root.iterdir())
             if split and _visible(entry.name) and entry.name not in SPLIT_FOLDERS]
    for (classes, strays), is_test in folders:
        loose += [Bad(str(file), "not in a class folder") for file in strays]
        for name, folder in classes.items():
            label = class_names.index(name)
            files += [(file, label, is_test) for file in sorted(folder.rglob("*"))
                      if file.is_file() and all(map(_visible, file.relative_to(folder).parts))]
    return class_names, files, loose, split is not None


def _probe(file: Path) -> tuple[tuple[int, int], str]:
    """((height, width), mode) of an image file, after decoding it all: a truncated file
    fails here, before anything is written."""
    with Image.open(file) as image:
        image.load()
        return (image.height, image.width), image.mode


def _open_image(file: Path) -> Image.Image:
    try:
        with Image.open(file) as image:
            image.load()
            return image.copy()
    except DECODE_ERRORS as error:  # it decoded when it was read first: changed since
        raise DataError(f"{file}: does not decode any more ({_first_line(error)}): was it "
                        f"changed during preparation?") from None


def _folder_source(root: Path, *, skip_bad: bool, progress: bool) -> Source:
    class_names, files, bad, has_split = _folder_files(root)
    kept, sizes, modes = [], [], []
    for file, label, is_test in tqdm(files, desc=f"reading {root.name}", unit="file",
                                     disable=None if progress else True):
        try:
            size, mode = _probe(file)
        except UnidentifiedImageError:
            bad.append(Bad(str(file), "not an image that Pillow reads"))
            continue
        except DECODE_ERRORS as error:
            bad.append(Bad(str(file), f"does not decode ({_first_line(error)})"))
            continue
        kept.append((file, label, is_test))
        sizes.append(size)
        modes.append(mode)
    if bad and not skip_bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise DataError(f"{bad[0].path}: {bad[0].reason}{more}: remove it, or pass --skip-bad "
                        f"to leave such files out")
    return Source(
        "folder", root, tuple(class_names),
        labels=np.array([label for _, label, _ in kept], np.int64),
        sizes=np.array(sizes, np.int64).reshape(-1, 2), modes=modes,
        test=np.array([is_test for _, _, is_test in kept], bool) if has_split else None,
        image=lambda i: _open_image(kept[i][0]), where=lambda i: str(kept[i][0]), bad=bad)


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


# --- arrays: an .npz, IDX files ----------------------------------------------------------

def _array_source(kind: str, path: Path, images: np.ndarray, *, labels: np.ndarray,
                  class_names: tuple[str, ...], test: np.ndarray | None) -> Source:
    """A source over images uint8[N, H, W] or [N, H, W, 3] held in memory."""
    mode = "L" if images.ndim == 3 else "RGB"
    return Source(kind, path, class_names, labels=labels.astype(np.int64),
                  sizes=np.tile(np.array(images.shape[1:3], np.int64), (len(images), 1)),
                  modes=[mode] * len(images), test=test,
                  image=lambda i: Image.fromarray(images[i]),  # L or RGB, by its shape
                  where=lambda i: f"{path}: image {i}",
                  array=lambda rows: images[rows])


def _class_names_of(labels: np.ndarray, names: np.ndarray | None, where: str
                    ) -> tuple[str, ...]:
    """The classes' names: `names` as given, or "0".."K-1" for labels 0..K-1; DataError when a
    label falls outside them."""
    if labels.size and labels.min() < 0:
        raise DataError(f"{where}: label {labels.min()} is negative: labels index the classes")
    if names is None:
        return tuple(str(k) for k in range(int(labels.max(initial=-1)) + 1))
    if names.ndim != 1 or names.dtype.kind not in "US":
        raise DataError(f"{where}: class_names must be a 1-D array of strings, found "
                        f"{names.dtype} {names.shape}")
    if labels.size and labels.max() >= len(names):
        raise DataError(f"{where}: label {labels.max()} is outside class_names "
                        f"({len(names)} names: labels must be 0..{len(names) - 1})")
    return tuple(str(name) for name in names)


def npz_shape(path: Path, key: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of array `key` in the .npz at `path`, read from its header alone, so a
    too-large array is refused before it is loaded."""
    try:
        with zipfile.ZipFile(path) as archive, archive.open(f"{key}.npy") as member:
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}
            version = np.lib.format.read_magic(member)
            if version not in read_header:
                raise ValueError(f".npy format {version}")
            shape, _, dtype = read_header[version](member)
    except KeyError:
        raise DataError(f"{path}: no array {key!r} (an .npz needs images and labels)") from None
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        raise DataError(f"{path}: not a readable .npz ({_first_line(error)})") from None
    return shape, dtype


def _npz_source(path: Path) -> Source:
    shape, dtype = npz_shape(path, "images")
    colour_ok = len(shape) == 3 or (len(shape) == 4 and shape[3] in (1, 3))
    if dtype != np.uint8 or not colour_ok:
        raise DataError(f"{path}: images must be uint8 (N, H, W) or (N, H, W, C) with C 1 or 3, "
                        f"found {dtype} {shape}")
    check_fits(shape[0] * int(np.prod(shape[1:])), where=str(path))
    with np.load(path, allow_pickle=False) as archive:
        labels = archive["labels"] if "labels" in archive else None
        if labels is None:
            raise DataError(f"{path}: no array 'labels' (an .npz needs images and labels)")
        names = archive["class_names"] if "class_names" in archive else None
        if labels.shape != shape[:1] or labels.dtype.kind not in "iu":
            raise DataError(f"{path}: labels must be integers of shape ({shape[0]},), found "
                            f"{labels.dtype} {labels.shape}")
        class_names = _class_names_of(labels, names, str(path))
        images = archive["images"]
    if images.ndim == 4 and images.shape[3] == 1:
        images = images[..., 0]
    return _array_source("npz", path, images, labels=labels, class_names=class_names,
                         test=None)


def _idx_source(folder: Path) -> Source:
    files = find_idx_files(folder)
    arrays = {name: read_idx(files[name]) for name in IDX_FILES}
    for images, labels in ((TRAIN_IMAGES, TRAIN_LABELS), (TEST_IMAGES, TEST_LABELS)):
        if arrays[images].ndim != 3 or arrays[labels].shape != arrays[images].shape[:1]:
            raise DataError(f"{files[images]}: expected images (N, H, W) and {files[labels]} "
                            f"N labels, found {arrays[images].shape} and {arrays[labels].shape}")
    if arrays[TRAIN_IMAGES].shape[1:] != arrays[TEST_IMAGES].shape[1:]:
        raise DataError(f"{folder}: train images are {arrays[TRAIN_IMAGES].shape[1:]}, test "
                        f"images {arrays[TEST_IMAGES].shape[1:]}: one size for both")
    images = np.concatenate([arrays[TRAIN_IMAGES], arrays[TEST_IMAGES]])
    labels = np.concatenate([arrays[TRAIN_LABELS], arrays[TEST_LABELS]]).astype(np.int64)
    test = np.arange(len(images)) >= len(arrays[TRAIN_IMAGES])
    return _array_source("idx", folder, images, labels=labels,
                         class_names=_class_names_of(labels, None, str(folder)), test=test)


def check_classes(source: Source) -> None:
    """DataError unless the source has 2 to `MAX_CLASSES` classes, each with a training image."""
    if len(source.class_names) < 2:
        raise DataError(f"{source.path}: {len(source.class_names)} class(es) found: a "
                        f"class-conditioned model needs two or more")
    if len(source.class_names) > MAX_CLASSES:
        raise DataError(f"{source.path}: {len(source.class_names)} classes found: a model takes "
                        f"at most {MAX_CLASSES:,}")
    train = source.labels if source.test is None else source.labels[~source.test]
    counts = collections.Counter(train.tolist())
    empty = [name for label, name in enumerate(source.class_names) if not counts[label]]
    if empty:
        raise DataError(f"{source.path}: class {empty[0]!r} has no training images"
                        + (f" (nor {len(empty) - 1} other classes)" if len(empty) > 1 else ""))
