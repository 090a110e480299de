"""cvae/data/digit_image.py: uploads -> MNIST-style 28x28 digits, and every way an upload is
refused."""

from __future__ import annotations

import io
import struct
import time
import zlib

import numpy as np
import pytest
from PIL import Image, ImageDraw

from cvae.data import digit_image
from cvae.data.digit_image import (BOX, CENTRE, DamagedImage, ImageTooLarge, NoDigit,
                                   UnsupportedImage, WrongSize, prepare_digit)
from cvae.limits import MAX_INPUT_PIXELS


def encoded(image: Image.Image | np.ndarray, fmt: str = "PNG", **options) -> bytes:
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def seven(size=(280, 280), ink=0, paper=255, mode="L", width=22) -> Image.Image:
    """A hand-drawn-looking 7 on a canvas, as the page's canvas would send it."""
    image = Image.new(mode, size, paper)
    w, h = size
    ImageDraw.Draw(image).line([(w * 0.36, h * 0.14), (w * 0.68, h * 0.14), (w * 0.43, h * 0.9)],
                               fill=ink, width=width)
    return image


def extent(image: np.ndarray) -> tuple[int, int]:
    rows, cols = np.flatnonzero(image.any(axis=1)), np.flatnonzero(image.any(axis=0))
    return rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1


def centre_of_mass(image: np.ndarray) -> tuple[float, float]:
    weights = image.astype(np.float64)
    mass = weights.sum()
    index = np.arange(28)
    return (weights.sum(axis=1) @ index) / mass, (weights.sum(axis=0) @ index) / mass


# ---- made as MNIST was -------------------------------------------------------------------


def test_digit_fills_20_px_on_its_longer_side_with_its_centre_of_mass_at_the_centre():
    prepared = prepare_digit(encoded(seven()))
    assert prepared.shape == (28, 28) and prepared.dtype == np.uint8
    height, width = extent(prepared)
    assert max(height, width) == BOX
    row, col = centre_of_mass(prepared)
    assert abs(row - CENTRE) <= 0.5 and abs(col - CENTRE) <= 0.5
    assert prepared.max() == 255 and prepared[0].max() == 0  # light on black, border empty


def test_aspect_ratio_is_kept():
    image = Image.new("L", (400, 300), 255)
    ImageDraw.Draw(image).rectangle((100, 100, 299, 199), outline=0, width=12)  # 200 x 100 box
    height, width = extent(prepare_digit(encoded(image)))
    assert width == BOX and abs(height - BOX / 2) <= 1


def test_dark_on_light_and_light_on_dark_give_the_same_digit():
    assert np.array_equal(prepare_digit(encoded(seven(ink=0, paper=255))),
                          prepare_digit(encoded(seven(ink=255, paper=0))))


def test_grey_paper_and_a_colour_photo_are_normalised_like_black_and_white():
    reference = prepare_digit(encoded(seven()))
    grey = prepare_digit(encoded(seven(ink=60, paper=200)))
    colour = prepare_digit(encoded(seven(ink=(20, 20, 90), paper=(230, 220, 200), mode="RGB")))
    for other in (grey, colour):
        assert np.abs(other.astype(int) - reference).mean() < 2.0


def test_strokes_on_a_transparent_canvas_are_found_whatever_their_colour():
    reference = prepare_digit(encoded(seven()))
    for ink in ((0, 0, 0, 255), (255, 255, 255, 255)):
        canvas = seven(ink=ink, paper=(0, 0, 0, 0), mode="RGBA")
        assert np.array_equal(prepare_digit(encoded(canvas)), reference), ink
        large = seven(size=(1400, 1400), width=110, ink=ink, paper=(0, 0, 0, 0), mode="RGBA")
        assert np.abs(prepare_digit(encoded(large)).astype(int) - reference).mean() < 3.0


def test_jpeg_and_large_pictures_give_nearly_the_same_digit():
    reference = prepare_digit(encoded(seven())).astype(int)
    jpeg = prepare_digit(encoded(seven().convert("RGB"), "JPEG", quality=80))
    photo = seven(size=(2800, 2800), width=220).convert("RGB")  # shrunk while decoding
    for other in (jpeg, prepare_digit(encoded(photo, "JPEG", quality=85)),
                  prepare_digit(encoded(seven(size=(1400, 1400), width=110)))):
        assert np.abs(other - reference).mean() < 3.0


@pytest.mark.parametrize("ink, paper", [(0, 65535), (1000, 60000), (60000, 1000)])
def test_a_16_bit_grey_png_gives_the_digit_its_8_bit_twin_gives(ink, paper):
    deep = Image.fromarray(np.where(np.asarray(seven()) == 0, ink, paper).astype(np.uint16))
    assert Image.open(io.BytesIO(encoded(deep))).mode == "I;16"
    twin = seven(ink=ink >> 8, paper=paper >> 8)
    assert np.array_equal(prepare_digit(encoded(deep)), prepare_digit(encoded(twin)))


def test_an_mnist_style_digit_comes_back_nearly_unchanged():
    once = prepare_digit(encoded(seven()))
    twice = prepare_digit(encoded(once))
    assert np.abs(twice.astype(int) - once).mean() < 1.0


def test_prepare_none_takes_28x28_pixels_as_they_are():
    pixels = np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8)
    assert np.array_equal(prepare_digit(encoded(pixels), "none"), pixels)
    with pytest.raises(WrongSize, match="28x28 .* 30x28"):
        prepare_digit(encoded(np.zeros((28, 30), np.uint8)), "none")
    for level in (0, 255):  # blank as it is: refused like a blank canvas
        with pytest.raises(NoDigit, match="blank"):
            prepare_digit(encoded(np.full((28, 28), level, np.uint8)), "none")


# ---- refused ---------------------------------------------------------------------------------


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height and carries a few bytes of pixel data: what a
    decompression bomb looks like before it is decoded."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("width, height", [(5000, 5000), (100_000, 100_000)])
def test_too_many_pixels_are_refused_from_the_header_before_decoding(width, height):
    assert width * height > MAX_INPUT_PIXELS
    start = time.perf_counter()
    # The pixel data is 64 bytes: decoding it would fail as damaged, so ImageTooLarge proves
    # the refusal came first. 100k x 100k is past Pillow's own limit (DecompressionBombError).
    with pytest.raises(ImageTooLarge, match="pixels"):
        prepare_digit(png_header_only(width, height))
    assert time.perf_counter() - start < 5  # nothing the size of the image was made


def test_a_picture_just_under_the_pixel_limit_is_decoded():
    with pytest.raises(DamagedImage):  # read past the header: the data is short, not refused
        prepare_digit(png_header_only(4096, 4096))


@pytest.mark.parametrize("data", [b"", b"hello", b"GIF89a" + b"\0" * 40,
                                  b'{"image": "iVBORw0KGgo="}'])
def test_what_is_not_a_png_or_jpeg_is_unsupported(data):
    with pytest.raises(UnsupportedImage):
        prepare_digit(data)


def test_gif_and_bmp_are_refused_even_when_valid():
    for fmt in ("GIF", "BMP"):
        with pytest.raises(UnsupportedImage, match="not a PNG or JPEG"):
            prepare_digit(encoded(seven(), fmt))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_file_is_damaged(fmt):
    data = encoded(seven(), fmt)
    with pytest.raises(DamagedImage, match="damaged or truncated"):
        prepare_digit(data[:len(data) // 2])


@pytest.mark.parametrize("level", [0, 128, 255])
def test_blank_canvas_has_no_digit(level):
    with pytest.raises(NoDigit, match="blank"):
        prepare_digit(encoded(Image.new("L", (280, 280), level)))


def test_faint_marks_under_the_contrast_floor_are_no_digit():
    faint = seven(ink=230, paper=255)  # 25 grey levels: below MIN_CONTRAST of full scale
    assert (255 - 230) / 255 < digit_image.MIN_CONTRAST
    with pytest.raises(NoDigit):
        prepare_digit(encoded(faint))


def test_every_refusal_is_an_image_input_error_with_a_sentence():
    for data in (b"", encoded(seven())[:100], encoded(Image.new("L", (9, 9), 0))):
        with pytest.raises(digit_image.ImageInputError) as caught:
            prepare_digit(data)
        assert len(str(caught.value)) > 20


# ---- a colour model's uploads: the whole picture, fitted or as it is ----------------------------


def test_fit_crops_the_picture_to_the_models_aspect_and_resizes_it_in_colour():
    picture = np.zeros((40, 80, 3), np.uint8)  # twice as wide as high: the sides are cropped
    picture[:, :20] = (255, 0, 0)  # cropped away
    picture[:, 20:60] = (0, 0, 255)
    fitted = prepare_digit(encoded(picture), "fit", shape=(8, 8, 3))
    assert fitted.shape == (8, 8, 3) and fitted.dtype == np.uint8
    # Blue throughout; Lanczos' support reaches a little past the crop at the two edges.
    assert fitted[..., 2].min() > 230 and fitted[..., 1].max() == 0
    assert fitted[:, 1:-1, 0].max() <= 2 and fitted[..., 0].max() < 30


def test_fit_lays_transparency_over_white_and_serves_grey_shapes_in_luminance():
    clear = np.zeros((16, 16, 4), np.uint8)  # fully transparent
    assert (prepare_digit(encoded(clear), "fit", shape=(8, 8, 3)) == 255).all()
    green = np.zeros((16, 16, 3), np.uint8)
    green[..., 1] = 200
    grey = prepare_digit(encoded(green), "fit", shape=(8, 8))
    assert grey.shape == (8, 8) and (grey == round(0.587 * 200)).all()  # Pillow's "L"


def test_a_colour_picture_is_taken_as_it_is_only_at_the_models_size():
    picture = np.random.default_rng(0).integers(0, 256, (6, 8, 3), dtype=np.uint8)
    assert np.array_equal(prepare_digit(encoded(picture), "none", shape=(6, 8, 3)), picture)
    with pytest.raises(WrongSize, match="takes a 8x8 image as it is; this one is 8x6"):
        prepare_digit(encoded(picture), "none", shape=(8, 8, 3))
