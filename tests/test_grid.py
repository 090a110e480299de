"""Tests for cvae.sampling.grid: layout geometry, tile placement, quantisation, PNG encoding,
validation."""

import io
import os

import numpy as np
import pytest
from PIL import Image

from cvae.sampling.grid import grid_png, grid_pngs, grid_shape, make_grid, png_bytes, save_png


def constant_tiles(n: int) -> np.ndarray:
    """uint8[n, 28, 28] where image i is filled with the value 10 + i (all distinct, never 0)."""
    return np.stack([np.full((28, 28), 10 + i, dtype=np.uint8) for i in range(n)])


@pytest.mark.parametrize(
    ("n", "cols", "scale", "pad", "expected"),
    [
        (1, 1, 1, 2, (32, 32)),
        (16, 4, 1, 2, (122, 122)),
        (10, 4, 1, 2, (92, 122)),  # n not a multiple of cols: 3 rows
        (10, 10, 1, 0, (28, 280)),  # pad=0: tiles touch, no border
        (3, 2, 8, 2, (2 * 226 + 2, 2 * 226 + 2)),  # scale=8: 224 px tiles
        (5, 8, 2, 8, (72, 8 * 64 + 8)),  # cols > n: one row, empty tiles
    ],
)
def test_grid_shape_follows_make_grid_convention(n, cols, scale, pad, expected):
    assert grid_shape(n, cols, scale=scale, pad=pad) == expected
    images = np.zeros((n, 28, 28), dtype=np.float32)
    assert make_grid(images, cols, pad=pad, scale=scale).shape == expected


def test_grid_shape_matches_formula_over_a_sweep():
    for n in (1, 2, 7, 16, 33):
        for cols in (1, 3, 8):
            for scale in (1, 3, 8):
                for pad in (0, 1, 8):
                    rows = -(-n // cols)
                    step = 28 * scale + pad
                    assert grid_shape(n, cols, scale=scale, pad=pad) == (rows * step + pad,
                                                                         cols * step + pad)


@pytest.mark.parametrize(("scale", "pad"), [(1, 2), (1, 0), (3, 5), (8, 8)])
def test_tiles_are_placed_row_major_with_padding_of_pad_value(scale, pad):
    n, cols, pad_value = 7, 3, 255
    grid = make_grid(constant_tiles(n), cols, pad=pad, scale=scale, pad_value=pad_value)
    size = 28 * scale
    expected = np.full(grid.shape, pad_value, dtype=np.uint8)
    for i in range(n):
        row, col = divmod(i, cols)
        top, left = pad + row * (size + pad), pad + col * (size + pad)
        assert grid[top, left] == 10 + i  # tile origin
        assert grid[top + size - 1, left + size - 1] == 10 + i  # tile's last pixel
        expected[top : top + size, left : left + size] = 10 + i
    np.testing.assert_array_equal(grid, expected)  # everything else is padding


def test_empty_tiles_in_last_row_are_background():
    grid = make_grid(constant_tiles(5), cols=4, pad=2, pad_value=7)
    assert grid.shape == (62, 122)
    last_row = grid[32:60]
    assert (last_row[:, 2:30] == 14).all()  # image 4 in the first column
    assert (last_row[:, 30:] == 7).all()  # three empty tiles and their padding


def test_scale_is_nearest_neighbour_upscale():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(1, 28, 28), dtype=np.uint8)
    grid = make_grid(image, cols=1, pad=0, scale=3)
    np.testing.assert_array_equal(grid, np.kron(image[0], np.ones((3, 3), dtype=np.uint8)))


def test_float_images_are_clipped_and_rounded_half_to_even():
    values = np.array([0.0, 1.0, 0.5, -0.3, 1.7, 1 / 255, 0.998, np.inf], dtype=np.float32)
    images = np.broadcast_to(values[:, None, None], (len(values), 28, 28))
    grid = make_grid(images, cols=len(values), pad=0)
    origins = grid[0, ::28]
    # 0.5*255 = 127.5 -> 128 (np.round rounds halves to even); out of range is clipped.
    np.testing.assert_array_equal(origins, [0, 255, 128, 0, 255, 1, 254, 255])
    assert grid.dtype == np.uint8


def test_float64_and_float32_quantise_the_same():
    rng = np.random.default_rng(1)
    images = rng.random((4, 28, 28))
    np.testing.assert_array_equal(
        make_grid(images, cols=2), make_grid(images.astype(np.float32), cols=2)
    )


def test_uint8_images_pass_through_unchanged():
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, size=(6, 28, 28), dtype=np.uint8)
    grid = make_grid(images, cols=3, pad=1)
    for i in range(6):
        row, col = divmod(i, 3)
        top, left = 1 + row * 29, 1 + col * 29
        np.testing.assert_array_equal(grid[top : top + 28, left : left + 28], images[i])


def test_flat_784_images_give_the_same_grid():
    rng = np.random.default_rng(3)
    images = rng.random((5, 28, 28), dtype=np.float32)
    np.testing.assert_array_equal(
        make_grid(images.reshape(5, 784), cols=2), make_grid(images, cols=2)
    )


def test_png_round_trip_gives_identical_array_in_mode_L():
    grid = make_grid(np.random.default_rng(4).random((10, 28, 28)), cols=4, scale=2, pad=3)
    with Image.open(io.BytesIO(png_bytes(grid))) as image:
        assert image.format == "PNG"
        assert image.mode == "L"
        assert image.size == (grid.shape[1], grid.shape[0])
        np.testing.assert_array_equal(np.asarray(image), grid)


def test_same_grid_gives_same_png_bytes():
    images = np.random.default_rng(5).random((9, 28, 28))
    first = png_bytes(make_grid(images, cols=3))
    second = png_bytes(make_grid(images.copy(), cols=3))
    assert first == second
    assert first.startswith(b"\x89PNG\r\n\x1a\n")


def test_png_has_no_metadata_chunks():
    data = png_bytes(make_grid(constant_tiles(2), cols=2))
    for chunk in (b"tEXt", b"zTXt", b"iTXt", b"tIME", b"eXIf", b"pHYs"):
        assert chunk not in data


def test_save_png_creates_parent_dirs_and_writes_png_bytes(tmp_path):
    grid = make_grid(constant_tiles(3), cols=2)
    path = tmp_path / "a" / "b" / "grid.png"
    assert save_png(grid, str(path)) == path
    assert path.read_bytes() == png_bytes(grid)
    assert os.listdir(path.parent) == ["grid.png"]  # no temporary file left behind


def test_save_png_replaces_an_existing_file(tmp_path):
    path = tmp_path / "grid.png"
    path.write_bytes(b"old")
    grid = make_grid(constant_tiles(1), cols=1)
    save_png(grid, path)
    assert path.read_bytes() == png_bytes(grid)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"cols": 0}, "cols"),
        ({"cols": 2.0}, "cols"),
        ({"scale": 0}, "scale"),
        ({"scale": 9}, "scale"),
        ({"pad": -1}, "pad"),
        ({"pad": 9}, "pad"),
        ({"pad_value": 256}, "pad_value"),
    ],
)
def test_bad_layout_argument_raises_value_error_naming_it(kwargs, name):
    arguments = {"cols": 2, **kwargs}
    with pytest.raises(ValueError, match=rf"^{name} must be an integer"):
        make_grid(np.zeros((4, 28, 28), dtype=np.float32), **arguments)


@pytest.mark.parametrize(
    ("images", "fragment"),
    [
        (np.zeros((4, 28, 27)), r"\[N, 28, 28\]"),
        (np.zeros((28, 28)), r"\[N, 28, 28\]"),
        (np.zeros((2, 1, 28, 28)), r"\[N, 28, 28\]"),
        (np.zeros((0, 28, 28)), "n >= 1"),
        (np.zeros((2, 28, 28), dtype=np.int64), "dtype"),
        (np.full((2, 28, 28), np.nan), "NaN"),
    ],
)
def test_bad_images_raise_value_error_naming_images(images, fragment):
    with pytest.raises(ValueError, match=rf"^images must .*{fragment}"):
        make_grid(images, cols=2)


def test_grid_shape_bad_n_raises_value_error_naming_n():
    with pytest.raises(ValueError, match=r"^n must be an integer >= 1"):
        grid_shape(0, 4)


@pytest.mark.parametrize(
    "grid",
    [
        np.zeros((4, 4), dtype=np.float32),
        np.zeros((4, 4, 2), dtype=np.uint8),
        np.zeros((0, 4), dtype=np.uint8),
    ],
)
def test_png_bytes_rejects_what_is_neither_a_grey_nor_an_rgb_grid(grid):
    with pytest.raises(ValueError, match=r"^grid must be a non-empty uint8\[H, W\] or"):
        png_bytes(grid)


# ---- colour tiles: (h, w, 3) -> an RGB grid and an RGB PNG ------------------------------------

COLOUR = (6, 5, 3)  # a non-square RGB tile, so height and width cannot be swapped unseen


def test_colour_tiles_are_placed_channel_by_channel():
    images = np.random.default_rng(8).integers(0, 256, (5, *COLOUR), dtype=np.uint8)
    grid = make_grid(images, cols=2, pad=1, pad_value=7, image_shape=COLOUR)
    assert grid.shape == (*grid_shape(5, 2, pad=1, image_shape=COLOUR), 3)
    for i in range(5):
        row, col = divmod(i, 2)
        top, left = 1 + row * 7, 1 + col * 6
        np.testing.assert_array_equal(grid[top:top + 6, left:left + 5], images[i])
    assert (grid[0] == 7).all()  # the border, in every channel


def test_flat_colour_images_give_the_same_grid_as_shaped_ones():
    images = np.random.default_rng(9).random((4, *COLOUR), dtype=np.float32)
    np.testing.assert_array_equal(make_grid(images.reshape(4, -1), cols=3, image_shape=COLOUR),
                                  make_grid(images, cols=3, image_shape=COLOUR))


def test_colour_png_round_trip_gives_identical_array_in_mode_rgb():
    images = np.random.default_rng(10).random((7, *COLOUR))
    grid = make_grid(images, cols=3, scale=2, pad=2, image_shape=COLOUR)
    with Image.open(io.BytesIO(png_bytes(grid))) as image:
        assert image.mode == "RGB"
        np.testing.assert_array_equal(np.asarray(image), grid)


def test_one_channel_tiles_give_the_grey_grid_and_its_bytes():
    images = np.random.default_rng(11).random((3, 28, 28), dtype=np.float32)
    grey = png_bytes(make_grid(images, cols=3))
    assert png_bytes(make_grid(images[..., None], cols=3, image_shape=(28, 28, 1))) == grey


def test_a_channel_count_other_than_one_or_three_is_refused_by_name():
    with pytest.raises(ValueError, match=r"^image_shape must be .*got \(6, 5, 4\)"):
        make_grid(np.zeros((2, 6, 5, 4)), cols=2, image_shape=(6, 5, 4))


@pytest.mark.parametrize("shape", [(28, 28), (28, 28, 1), (32, 32, 3), (20, 12)])
def test_grid_png_gives_the_bytes_of_png_bytes_of_make_grid(shape):
    """The service's one-pass encoder (`grid_png`) against the reference layout + encoding:
    full and partial last rows, scales, pads and backgrounds, floats and uint8."""
    rng = np.random.default_rng(0)
    for n, cols, scale, pad, pad_value in [(1, 1, 1, 0, 0), (16, 4, 1, 2, 0), (17, 4, 2, 5, 255),
                                           (5, 3, 3, 2, 7), (3, 16, 1, 0, 0)]:
        images = rng.random((n, *shape), dtype=np.float32)
        options = dict(pad=pad, scale=scale, pad_value=pad_value, image_shape=shape)
        assert grid_png(images, cols, **options) == png_bytes(make_grid(images, cols, **options))
        tiles = (images * 255).astype(np.uint8)
        assert grid_png(tiles, cols, **options) == png_bytes(make_grid(tiles, cols, **options))


@pytest.mark.parametrize("shape", [(28, 28), (32, 32, 3), (20, 12)])
def test_grid_pngs_gives_each_grid_the_bytes_of_grid_png(shape):
    """A batch's pictures of one layout, laid out together: each one's own bytes."""
    rng = np.random.default_rng(1)
    for n, cols, scale, pad, pad_value in [(16, 4, 1, 2, 0), (17, 4, 2, 5, 255), (1, 1, 1, 0, 0)]:
        grids = [rng.random((n, *shape), dtype=np.float32) for _ in range(5)]
        options = dict(pad=pad, scale=scale, pad_value=pad_value, image_shape=shape)
        assert grid_pngs(grids, cols, **options) == [grid_png(g, cols, **options) for g in grids]


def test_grid_pngs_refuses_grids_of_other_sizes_and_bad_images_as_grid_png_does():
    with pytest.raises(ValueError, match=r"equally many images, got \[2, 3\]"):
        grid_pngs([np.zeros((2, 28, 28)), np.zeros((3, 28, 28))], 2)
    bad = np.zeros((2, 28, 28))
    bad[1, 3, 3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        grid_pngs([np.zeros((2, 28, 28)), bad], 2)
