"""A prepared dataset of one's own, as `cvae data --from PATH --name NAME` leaves it, and read back.

`DATA_DIR/NAME/` holds four NumPy files and a manifest:

- `train_images.npy`, `test_images.npy`: uint8[N, H, W] (grey) or [N, H, W, 3] (colour), the
  spec's `stored_shape`, as the built-in datasets' IDX files hold them;
- `train_labels.npy`, `test_labels.npy`: int32[N], indices into the manifest's `class_names`;
- `manifest.json`: where the images came from, the classes and their counts, the shape, the
  split, the resizing and mode conversions (and the rule that chose grey or colour), the
  background transparency was composited onto and how many images had any, the files left
  out, and `sha256`, the SHA-256 of the four files and the class names.

.npy rather than IDX: it holds colour and label counts past 255, and a preallocated
`np.lib.format.open_memmap` is written one image at a time. The manifest becomes the dataset's
`DatasetSpec` (`spec_of_manifest`), registered by `register_prepared` before a config names it.
No JAX here.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from cvae.data import specs
from cvae.data.idx import TEST_IMAGES, TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS
from cvae.data.memory import check_fits
from cvae.errors import DataError

MANIFEST = "manifest.json"
FORMAT = 1  # the manifest's `format`: raised when the layout changes
# The IDX names `cvae.data.load` keys its arrays by -> this format's file for each.
FILES = {TRAIN_IMAGES: "train_images.npy", TRAIN_LABELS: "train_labels.npy",
         TEST_IMAGES: "test_images.npy", TEST_LABELS: "test_labels.npy"}
_HASH_CHUNK = 2**20


def folder_of(data_dir: str | os.PathLike, name: str) -> Path:
    return Path(data_dir) / name


def content_hash(folder: Path, class_names: tuple[str, ...]) -> str:
    """The SHA-256 (hex) of the four files' bytes and the class names: the same images, labels
    and names give the same hash, wherever and whenever they were prepared."""
    digest = hashlib.sha256(json.dumps(list(class_names)).encode())
    for name in FILES.values():
        with open(folder / name, "rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: not found: prepare the dataset with `cvae data --from PATH "
                        f"--name {folder.name}`") from None
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: not a readable manifest ({error})") from None
    if manifest.get("format") != FORMAT:
        raise DataError(f"{path}: format {manifest.get('format')!r}, this version reads "
                        f"{FORMAT}: prepare it again with `cvae data --from`")
    return manifest


def spec_of_manifest(manifest: dict) -> specs.DatasetSpec:
    """The dataset's spec: its folder is its name, it has no offline source, and its manifest's
    hash names its content."""
    height, width, channels = manifest["image_shape"]
    name = manifest["name"]
    return specs.DatasetSpec(name, name, name, height, width, channels,
                             tuple(manifest["class_names"]), source=None,
                             content_hash=manifest["sha256"])


def register_prepared(data_dir: str | os.PathLike, name: str) -> specs.DatasetSpec | None:
    """Registers dataset `name` prepared under `data_dir`, when it is not built in and has a
    manifest there; None otherwise (the config then refuses the name with what to run)."""
    folder = folder_of(data_dir, name)
    if name in specs.SPECS or not (folder / MANIFEST).is_file():
        return None
    return specs.register(spec_of_manifest(read_manifest(folder)))


def load_arrays(data_dir: str | os.PathLike, spec: specs.DatasetSpec, *, test: bool
                ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The prepared arrays of `spec` (the training pair only unless `test`), keyed as
    `cvae.data.load` keys IDX files, and the path each came from. DataError when the folder
    holds other content than `spec` names (a model trained on other data), or when the
    images would not fit in memory (`cvae.data.memory`)."""
    folder = folder_of(data_dir, spec.name)
    manifest = read_manifest(folder)
    if manifest["sha256"] != spec.content_hash:
        raise DataError(f"{folder}: holds dataset {spec.name!r} with sha256 "
                        f"{manifest['sha256']}, not the {spec.content_hash} this model was "
                        f"trained on")
    counts = manifest["counts"]
    images = sum(counts["train"].values()) + (sum(counts["test"].values()) if test else 0)
    check_fits(images * spec.pixels, where=str(folder))
    wanted = FILES if test else {key: FILES[key] for key in (TRAIN_IMAGES, TRAIN_LABELS)}
    arrays, names = {}, {}
    for key, file in wanted.items():
        try:
            arrays[key] = np.load(folder / file, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise DataError(f"{folder / file}: not readable ({error}): prepare the dataset "
                            f"again with `cvae data --from`") from None
        names[key] = str(folder / file)
    return arrays, names
