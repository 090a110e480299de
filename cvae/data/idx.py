"""The IDX file format (uint8 only): read, write atomically, and find a dataset's four files.

Every header and size is checked, so a damaged or foreign file fails with one line naming the
file and the problem instead of a reshape error deep inside training. NumPy only.
"""

from __future__ import annotations

import gzip
import os
import secrets
import zlib
from pathlib import Path

import numpy as np

from cvae.errors import DataError

TRAIN_IMAGES = "train-images-idx3-ubyte"
TRAIN_LABELS = "train-labels-idx1-ubyte"
TEST_IMAGES = "t10k-images-idx3-ubyte"
TEST_LABELS = "t10k-labels-idx1-ubyte"
IDX_FILES = (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS)

_UINT8_CODE = 0x08


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


def _check_idx_size(path: Path, shape: tuple[int, ...], *, header_len: int, found: int) -> None:
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
    _check_idx_size(path, shape, header_len=header_len, found=len(data))
    return np.frombuffer(data, np.uint8, offset=header_len).reshape(shape)


def as_uint8(array: np.ndarray) -> np.ndarray:
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
    array = as_uint8(array)
    if not 1 <= array.ndim <= 255:
        raise ValueError(f"write_idx needs 1 to 255 dimensions, got {array.ndim}")
    header = bytes([0, 0, _UINT8_CODE, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    payload = header + np.ascontiguousarray(array).tobytes()
    if path.suffix == ".gz":
        payload = gzip.compress(payload, mtime=0)  # mtime=0: same array, same bytes
    _write_atomic(path, payload)


def plain_idx_shape(path: Path) -> tuple[int, ...]:
    """Shape from the header of an uncompressed IDX file, checked against its size on disk."""
    try:
        with open(path, "rb") as f:
            head = f.read(4 + 4 * 255)
        size = path.stat().st_size
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
    shape, header_len = _parse_idx_header(path, head)
    _check_idx_size(path, shape, header_len=header_len, found=size)
    return shape


def find_idx_files(directory: Path, names: tuple[str, ...] = IDX_FILES) -> dict[str, Path] | None:
    """The IDX files `names` (default all four) in `directory` (plain preferred over .gz), or
    None if any is missing."""
    found = {}
    for name in names:
        candidates = [directory / name, directory / f"{name}.gz"]
        existing = [path for path in candidates if path.is_file()]
        if not existing:
            return None
        found[name] = existing[0]
    return found
