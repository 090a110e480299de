"""Tile images (28x28 grey digits, or any one dataset's height x width, grey or RGB) into one
grid and encode it as a PNG.

Sampling (`cvae sample`) and the HTTP service (`GET /sample`) both return a grid of digits, and
the service promises byte-identical PNGs for the same seed, so the layout and the encoding live
here once, in pure NumPy with no JAX, where they can be tested instantly. The layout is
the `torchvision.utils.make_grid` convention (see docs/design.md, "HTTP service"): tiles of
`h*scale` x `w*scale` px, row-major, with `pad` px of background around every tile including
the outer border, so `width = cols*(w*scale+pad)+pad` and `height = rows*(h*scale+pad)+pad`.
A tile's shape is its dataset spec's (`DatasetSpec.stored_shape`: (h, w) for grey images,
(h, w, 3) for colour); callers pass it as `image_shape`, which defaults to MNIST's (28, 28). A
grey grid is an 8-bit grayscale PNG (mode L), a colour one an 8-bit RGB PNG, so the grids of
the grey datasets keep their pixels. The bytes are the same for the same pixels wherever
the encoder is the same (`encoder_signature`).
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Sequence

import isal
import numpy as np
from isal import isal_zlib

from cvae.data.pixels import MAX_LEVEL
from cvae.data.specs import MNIST
from cvae.limits import DEFAULT_PAD, DEFAULT_SCALE, MAX_PAD, MAX_SCALE


def _check_int(name: str, value: object, low: int, *, high: int | None = None) -> int:
    """Returns `value` as an int, or raises ValueError naming `name` and the allowed range.
    (The service checks a grid's sizes on every request: the message is built only for an
    error.)"""
    if type(value) is not int and (isinstance(value, (bool, np.bool_))
                                   or not isinstance(value, (int, np.integer))):
        raise ValueError(f"{name} must be {_allowed(low, high)}, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be {_allowed(low, high)}, got {value}")
    return value


def _allowed(low: int, high: int | None) -> str:
    return f"an integer >= {low}" if high is None else f"an integer in {low}..{high}"


def grid_columns(digit: int | None, n: int, cols: int | None) -> int:
    """One digit -> ceil(sqrt(n)) columns; all digits -> one row per digit, cols = n.

    The layout of docs/design.md, "HTTP service"; `cols` overrides it.
    """
    if cols is not None:
        return cols
    if digit is None:
        return n
    return math.isqrt(n - 1) + 1 if n > 0 else 0  # ceil(sqrt(n)) in integers (no float)


# A tile's shape when the caller names none: the default dataset's (height, width).
DEFAULT_IMAGE_SHAPE = MNIST.stored_shape
COLOUR_CHANNELS = 3  # RGB: the one colour layout a PNG grid is written in


def tile_shape(image_shape: tuple[int, ...]) -> tuple[int, ...]:
    """(h, w) or (h, w, 1) -> (h, w); (h, w, 3) -> (h, w, 3): the tile as the grid holds it.
    ValueError for any other channel count."""
    shape = tuple(int(side) for side in image_shape)
    if len(shape) == 3 and shape[2] == 1:
        return shape[:2]
    if len(shape) == 2 or (len(shape) == 3 and shape[2] == COLOUR_CHANNELS):
        return shape
    raise ValueError(f"image_shape must be (h, w), (h, w, 1) or (h, w, {COLOUR_CHANNELS}), "
                     f"got {shape}")


def grid_shape(n: int, cols: int, *, scale: int = DEFAULT_SCALE, pad: int = DEFAULT_PAD,
               image_shape: tuple[int, ...] = DEFAULT_IMAGE_SHAPE) -> tuple[int, int]:
    """Returns (height, width) in px of the grid that `make_grid` builds for `n` images of
    `image_shape` ((h, w) or (h, w, channels))."""
    n = _check_int("n", n, 1)
    cols = _check_int("cols", cols, 1)
    scale = _check_int("scale", scale, 1, high=MAX_SCALE)
    pad = _check_int("pad", pad, 0, high=MAX_PAD)
    rows = math.ceil(n / cols)
    height, width = image_shape[:2]
    return rows * (height * scale + pad) + pad, cols * (width * scale + pad) + pad


def _to_uint8(images: np.ndarray,
              image_shape: tuple[int, ...] = DEFAULT_IMAGE_SHAPE) -> np.ndarray:
    """images: float[N, *shape] or [N, prod(shape)] in [0, 1], or uint8 -> uint8[N, *shape],
    where shape = tile_shape(image_shape)."""
    images = np.asarray(images)
    shape = tile_shape(image_shape)
    size = math.prod(shape)
    if images.ndim == 2 and images.shape[1] == size or images.shape[1:] == (*shape, 1):
        images = images.reshape(-1, *shape)
    if images.shape[1:] != shape:
        dims = ", ".join(map(str, shape))
        raise ValueError(f"images must have shape [N, {dims}] or [N, {size}], "
                         f"got {list(images.shape)}")
    if images.shape[0] < 1:
        raise ValueError("images must hold n >= 1 images, got 0")
    if images.dtype == np.uint8:
        return images
    if not np.issubdtype(images.dtype, np.floating):
        raise ValueError(f"images must be floating in [0, 1] or uint8, got dtype {images.dtype}")
    if np.isnan(images).any():
        raise ValueError("images must not contain NaN")
    # Quantisation: round(clip(x, 0, 1) * 255) with halves to even (0.5 -> 127.5 -> 128), in
    # float32 whatever the input's dtype. Clipping after the multiply gives the same values
    # (x * 255 is monotonic and exact at 0 and 1) in one buffer instead of four.
    scaled = np.multiply(images, np.float32(MAX_LEVEL), dtype=np.float32)
    np.clip(scaled, 0.0, MAX_LEVEL, out=scaled)
    return np.rint(scaled, out=scaled).astype(np.uint8)


def make_grid(
    images: np.ndarray, cols: int, *, pad: int = DEFAULT_PAD, scale: int = DEFAULT_SCALE,
    pad_value: int = 0, image_shape: tuple[int, ...] = DEFAULT_IMAGE_SHAPE,
) -> np.ndarray:
    """Tiles images row-major into one grid, grayscale or RGB as the tiles are.

    Args:
      images: float[N, *image_shape] (or flattened, [N, h*w*c]) in [0, 1], clipped, quantised
        as `np.round(clip(x, 0, 1) * 255)` (round half to even); or uint8 used as is.
      cols: tiles per row (>= 1); rows = ceil(N / cols), empty tiles in the last row are background.
      pad: background px around every tile, outer border included (0..MAX_PAD).
      scale: nearest-neighbour integer upscale of each tile (1..MAX_SCALE).
      pad_value: background level (0..255), in every channel.
      image_shape: a tile's (h, w) or (h, w, c): the dataset spec's `stored_shape` (default
        MNIST's); c is 1 (grey) or 3 (RGB).

    Returns:
      uint8[H, W] (grey) or uint8[H, W, 3] (RGB), with (H, W) = grid_shape(N, cols, scale,
      pad, image_shape).
    """
    tiles, (height, width), pad_value = _scaled_tiles(
        images, cols, pad=pad, scale=scale, pad_value=pad_value, image_shape=image_shape)
    n = tiles.shape[0]
    tall, wide = image_shape[0] * scale, image_shape[1] * scale
    grid = np.full((height, width, *tiles.shape[3:]), pad_value, dtype=np.uint8)
    for index in range(n):
        row, col = divmod(index, cols)
        top = pad + row * (tall + pad)
        left = pad + col * (wide + pad)
        grid[top : top + tall, left : left + wide] = tiles[index]
    return grid


def _check_grid(grid: np.ndarray) -> np.ndarray:
    grid = np.asarray(grid)
    colour = grid.ndim == 3 and grid.shape[2] == COLOUR_CHANNELS
    if grid.ndim != 2 and not colour or grid.dtype != np.uint8 or grid.size == 0:
        raise ValueError(f"grid must be a non-empty uint8[H, W] or uint8[H, W, 3] array, got "
                         f"{grid.dtype}{list(grid.shape)}")
    return np.ascontiguousarray(grid)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# ISA-L's deflate (levels 0 to 3) at level 1: on a 16-digit grid of a trained MNIST model about
# a quarter of zlib's level-1 time (0.04 against 0.16 ms) for a file 3% smaller, and like zlib it
# releases the GIL while it compresses. The service's largest per-request cost was this deflate.
PNG_COMPRESS_LEVEL = 1
PNG_GRAY, PNG_RGB = 0, 2  # the IHDR colour types written


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(data, zlib.crc32(kind))))


_IEND = _png_chunk(b"IEND", b"")  # every PNG's last chunk, the same bytes each time


def _png(scanlines, width: int, height: int, *, kind: int) -> bytes:
    """The PNG file of `scanlines` (each row's filter byte, then its pixels): 8 bits a sample,
    no interlace, no metadata."""
    header = struct.pack(">IIBBBBB", width, height, 8, kind, 0, 0, 0)
    return b"".join((PNG_SIGNATURE, _png_chunk(b"IHDR", header),
                     _png_chunk(b"IDAT", isal_zlib.compress(scanlines, PNG_COMPRESS_LEVEL)),
                     _IEND))


@functools.cache
def encoder_signature() -> bytes:
    """What decides a PNG's bytes besides its pixels: ISA-L's version and the bytes it gives a
    fixed probe grid. ISA-L picks its kernels from the CPU's features; the service's
    fingerprint includes this, so replicas whose encoders differ never share an ETag."""
    index = np.arange(16 * 28 * 28, dtype=np.uint32)
    probe = ((index * 2654435761) >> 24).astype(np.uint8).reshape(16, 28, 28)
    probe[:, 4:24, 10:18] = 0  # runs as well as literals
    png = grid_png(probe, 4)
    return f"isa-l {isal.ISAL_VERSION} ".encode() + hashlib.sha256(png).digest()


def png_bytes(grid: np.ndarray) -> bytes:
    """Encodes grid uint8[H, W] as an 8-bit grayscale PNG, or uint8[H, W, 3] as an 8-bit RGB
    one (filter "None", ISA-L's deflate at level 1).

    Written out here rather than by Pillow because encoding is the service's largest
    per-request cost: Pillow's encoder tries every PNG row filter (adaptive filtering), which
    took 0.25 ms for a 16-digit grid against 0.06 ms for these few lines, for a file 1.6% larger
    (7,199 against 7,087 bytes), and compresses with zlib. Deterministic: no metadata or
    timestamps and fixed settings, so the same array gives the same bytes with the same encoder
    (`encoder_signature`). Any PNG reader (Pillow included) reads it; the tests check that it
    decodes back to `grid` exactly.
    """
    grid = _check_grid(grid)
    height, width = grid.shape[:2]
    row = grid.reshape(height, -1)  # RGB: r, g, b of each pixel in turn, as PNG stores them
    scanlines = np.zeros((height, row.shape[1] + 1), np.uint8)  # filter byte 0, then pixels
    scanlines[:, 1:] = row
    return _png(scanlines, width, height, kind=PNG_GRAY if grid.ndim == 2 else PNG_RGB)


def _scaled_tiles(images: np.ndarray, cols: int, *, pad: int, scale: int, pad_value: int,
                  image_shape: tuple[int, ...]):
    """The tiles as uint8, each upscaled `scale` times; the grid's (height, width); the checked
    background level: what `make_grid` and `grid_png` both start from."""
    tiles = _to_uint8(images, image_shape)
    size = grid_shape(tiles.shape[0], cols, scale=scale, pad=pad, image_shape=image_shape)
    pad_value = _check_int("pad_value", pad_value, 0, high=MAX_LEVEL)
    if scale > 1:
        tiles = tiles.repeat(scale, axis=1).repeat(scale, axis=2)
    return tiles, size, pad_value


def grid_png(
    images: np.ndarray, cols: int, *, pad: int = DEFAULT_PAD, scale: int = DEFAULT_SCALE,
    pad_value: int = 0, image_shape: tuple[int, ...] = DEFAULT_IMAGE_SHAPE,
) -> bytes:
    """`png_bytes(make_grid(images, cols, ...))`, the same bytes, for less work: the tiles are
    written straight into the PNG's scanlines (each row's filter byte, then its pixels) in one
    vectorised assignment, instead of a grid built tile by tile and then copied into scanlines.
    `cvae sample` and a lone request encode their pictures this way."""
    tiles, _, pad_value = _scaled_tiles(images, cols, pad=pad, scale=scale,
                                        pad_value=pad_value, image_shape=image_shape)
    [png] = _encode_grids(tiles[None], cols, pad=pad, scale=scale, pad_value=pad_value,
                          image_shape=image_shape)
    return png


def grid_pngs(
    grids: Sequence[np.ndarray], cols: int, *, pad: int = DEFAULT_PAD,
    scale: int = DEFAULT_SCALE, pad_value: int = 0,
    image_shape: tuple[int, ...] = DEFAULT_IMAGE_SHAPE,
) -> list[bytes]:
    """`grid_png` of each of `grids` (each images of `image_shape`, as many in each), the same
    bytes: the service's batch of requests with one layout, quantised and laid out in one pass
    of NumPy for all of them, then deflated one by one (ISA-L releases the GIL meanwhile)."""
    counts = {len(grid) for grid in grids}
    if len(counts) != 1:
        raise ValueError(f"grids must hold equally many images, got {sorted(counts)}")
    tiles, _, pad_value = _scaled_tiles(np.concatenate(grids), cols, pad=pad, scale=scale,
                                        pad_value=pad_value, image_shape=image_shape)
    return _encode_grids(tiles.reshape(len(grids), -1, *tiles.shape[1:]), cols, pad=pad,
                         scale=scale, pad_value=pad_value, image_shape=image_shape)


def _encode_grids(tiles: np.ndarray, cols: int, *, pad: int, scale: int, pad_value: int,
                  image_shape: tuple[int, ...]) -> list[bytes]:
    """The PNGs of R grids from their checked, scaled uint8 tiles [R, n, h*scale, w*scale(, 3)]:
    every grid's scanlines in one array, the tiles written into it in one assignment."""
    count, n = tiles.shape[:2]
    height, width = grid_shape(n, cols, scale=scale, pad=pad, image_shape=image_shape)
    rows = math.ceil(n / cols)
    tall, wide = image_shape[0] * scale, image_shape[1] * scale
    channels = tiles.shape[4] if tiles.ndim == 5 else 1
    if n < rows * cols:  # the last row's empty tiles are background
        blank = np.full((count, rows * cols - n, *tiles.shape[2:]), pad_value, np.uint8)
        tiles = np.concatenate([tiles, blank], axis=1)
    scanlines = np.full((count, height, 1 + width * channels), pad_value, np.uint8)
    scanlines[:, :, 0] = 0  # filter "None"
    # The tiles' area as a view (R, rows, tall, cols, wide, channels) into the scanlines;
    # setting `shape` (not reshape) refuses to copy, so the assignment lands in `scanlines`.
    area = scanlines[:, pad:pad + rows * (tall + pad), 1 + pad * channels:]
    area = area[:, :, :cols * (wide + pad) * channels]
    area.shape = (count, rows, tall + pad, cols, wide + pad, channels)
    area[:, :, :tall, :, :wide] = tiles.reshape(count, rows, cols, tall, wide,
                                                channels).swapaxes(2, 3)
    kind = PNG_GRAY if channels == 1 else PNG_RGB
    return [_png(lines, width, height, kind=kind) for lines in scanlines]


def save_png(grid: np.ndarray, path: str | os.PathLike[str]) -> Path:
    """Writes `png_bytes(grid)` to `path` atomically (temp file + os.replace); returns the path.

    Parent directories are created; readers never see a half-written file.
    """
    path = Path(path)
    data = png_bytes(grid)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp_name, 0o644)  # mkstemp makes 0600; outputs are meant to be shared.
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path
