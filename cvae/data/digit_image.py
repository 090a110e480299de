"""An uploaded picture of a digit -> the 28x28 MNIST-style image the model was trained on (or a
grey dataset's own height x width: `shape`, its spec's `stored_shape`; MNIST's by default).

Synopsis:

    image = prepare_digit(png_or_jpeg_bytes)                 # uint8[28, 28], light digit on black
    image = prepare_digit(mnist_png_bytes, prepare="none")   # a 28x28 picture taken as it is

MNIST was made this way (LeCun et al.): the digit's bounding box scaled, keeping its aspect
ratio, to fit a 20x20 box (anti-aliased), then placed in a 28x28 field so that its centre of mass
lies at the centre. MNIST's own digits have their centre of mass at pixel (14.0, 14.0) on average
(row and column index, measured on the training set), and the nonzero pixels of every one span 20
pixels on the longer side; `to_mnist` reproduces both.

Light and dark are told apart by the picture's border: the outermost ring of pixels is taken as
background (its median), so a digit may be dark on light (ink on paper, the page's canvas) or
light on dark (MNIST itself). When the ring is lighter than mid-grey the picture is inverted.
Transparent pixels are first laid over a background that contrasts with the ink (white under
dark ink, black under light ink), so a stroke on a transparent canvas works either way.

A colour model's upload (`shape` (h, w, 3)) is no digit to centre: `prepare="fit"` crops the
whole picture to the model's aspect ratio about its centre and resizes it to h x w in RGB
(transparency laid over white); `"none"` takes an h x w picture as it is. `"fit"` serves a grey
model too, in luminance, for data that is not drawn strokes.

Pictures are only read as PNG or JPEG, and their pixel count (from the header) is checked before
anything is decoded: a small file that would decompress to a huge image is refused.
Pure NumPy + Pillow, no JAX, so the tests run instantly.
"""

from __future__ import annotations

import io
import math
from typing import Literal

import numpy as np
from PIL import Image, ImageOps

from cvae.data.pixels import MAX_LEVEL, to_unit
from cvae.data.specs import MNIST
from cvae.limits import MAX_INPUT_PIXELS

BOX = 20  # the digit's bounding box is scaled to fit BOX x BOX (in a 28x28 field)
CENTRE = 14.0  # where MNIST's centre of mass lies (row and column index, see above)
# MNIST's field; other sizes keep its proportions (the box 20/28 of the shorter side, the
# centre of mass at the field's centre).
MNIST_SHAPE = MNIST.stored_shape
FORMATS = ("PNG", "JPEG")
WORK_SIDE = 512  # larger pictures are shrunk to this longer side first (20x20 needs no more)
MIN_CONTRAST = 0.15  # ink must be this much (of full scale) brighter than the background
INK_FLOOR = 0.15  # ink fainter than this (of the digit's contrast) is paper texture or noise

Prepare = Literal["mnist", "fit", "none"]
RGB = 3  # a colour image's channels


class ImageInputError(ValueError):
    """An upload that cannot become a digit image; the message says why, for the user."""


class UnsupportedImage(ImageInputError):
    """Not a PNG or JPEG picture at all."""


class ImageTooLarge(ImageInputError):
    """More pixels than MAX_INPUT_PIXELS: refused from the header, before decoding."""


class DamagedImage(ImageInputError):
    """A PNG or JPEG whose data is truncated or corrupt."""


class NoDigit(ImageInputError):
    """A blank picture (an empty canvas): nothing stands out from the background."""


class WrongSize(ImageInputError):
    """prepare="none" was asked for a picture that is not 28x28."""


def read_gray(data: bytes, max_pixels: int = MAX_INPUT_PIXELS) -> np.ndarray:
    """PNG or JPEG bytes -> luminance float32[H, W] in [0, 1], transparency resolved
    (`read_picture`)."""
    return read_picture(data, _luminance, max_pixels)


def read_picture(data: bytes, convert, max_pixels: int = MAX_INPUT_PIXELS) -> np.ndarray:
    """PNG or JPEG bytes -> `convert(the loaded Pillow image)`.

    The pixel count is checked on the header alone, before decoding: Pillow's `Image.open`
    parses only the header, and raises `DecompressionBombError` (or warns) itself beyond its
    own, larger limit `Image.MAX_IMAGE_PIXELS`; both are refused the same way.
    """
    if not data:
        raise UnsupportedImage("the request body is empty: send the bytes of a PNG or JPEG image")
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise ImageTooLarge(f"the image is too large to decode: {error} (at most "
                            f"{max_pixels:,} pixels)") from None
    except Image.UnidentifiedImageError:
        raise UnsupportedImage("the body is not a PNG or JPEG image: send the image file's "
                               "bytes as the body (not a form or base64)") from None
    except (OSError, SyntaxError, ValueError) as error:  # a header Pillow cannot parse
        raise DamagedImage(f"the {describe(data)} image is damaged or truncated: "
                           f"{error}") from None
    with image:
        width, height = image.size
        if width * height > max_pixels:
            raise ImageTooLarge(f"the image is {width}x{height} = {width * height:,} pixels; "
                                f"at most {max_pixels:,} are decoded")
        if max(width, height) > WORK_SIDE:
            # JPEG: decode at 1/2, 1/4 or 1/8 scale
            image.draft("L" if convert is _luminance else "RGB", (WORK_SIDE, WORK_SIDE))
        try:
            image.load()
            return convert(image)
        except (OSError, SyntaxError, ValueError, EOFError) as error:
            raise DamagedImage(f"the {image.format} image is damaged or truncated: "
                               f"{error}") from None


def describe(data: bytes) -> str:
    return "PNG" if data.startswith(b"\x89PNG") else "JPEG" if data.startswith(b"\xff\xd8") \
        else "uploaded"


def _luminance(image: Image.Image) -> np.ndarray:
    """Opaque 8-bit luminance in [0, 1], shrunk to WORK_SIDE first (so a large picture never
    becomes a large float array); alpha laid over a contrasting background."""
    if image.mode.startswith("I"):  # 16-bit grey (I;16*, or I from a 16-bit PNG): Pillow's
        # convert("L") would clip at 255 rather than scale, so take the high byte
        image = Image.fromarray((np.clip(np.asarray(image), 0, 65535) >> 8).astype(np.uint8))
    has_alpha = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
    image = image.convert("RGBA" if has_alpha else "L")
    if max(image.size) > WORK_SIDE:  # Pillow resizes RGBA with premultiplied alpha
        image.thumbnail((WORK_SIDE, WORK_SIDE), Image.Resampling.BOX)
    if not has_alpha:
        return to_unit(np.asarray(image))
    rgba = to_unit(np.asarray(image))
    alpha = rgba[..., 3]
    gray = rgba[..., :3] @ np.float32([0.299, 0.587, 0.114])  # ITU-R 601-2, as Pillow's "L"
    weight = alpha.sum()
    ink_is_dark = weight == 0 or float((gray * alpha).sum() / weight) < 0.5
    background = np.float32(1.0 if ink_is_dark else 0.0)
    return to_unit(np.round((alpha * gray + (1 - alpha) * background) * MAX_LEVEL))


def ink(gray: np.ndarray) -> np.ndarray:
    """Luminance [H, W] -> ink float32[H, W] in [0, 1]: light on dark, background at 0.

    The background is the median of the outermost ring of pixels; a light one means a dark
    digit, so the picture is inverted. Ink is rescaled so the darkest background is 0 and the
    strongest stroke 1; what stays under INK_FLOOR is cleared.
    """
    ring = np.concatenate([gray[0], gray[-1], gray[1:-1, 0], gray[1:-1, -1]])
    background = float(np.median(ring))
    if background > 0.5:
        gray, background = 1.0 - gray, 1.0 - background
    peak = float(gray.max())
    if peak - background < MIN_CONTRAST:
        raise NoDigit(f"no digit found: the image is blank (its brightest stroke stands "
                      f"{peak - background:.2f} above the background; at least {MIN_CONTRAST} "
                      f"of full scale is needed)")
    values = np.clip((gray - background) / (peak - background), 0.0, 1.0)
    values[values < INK_FLOOR] = 0.0
    return values.astype(np.float32)


def to_mnist(values: np.ndarray, shape: tuple[int, int] = MNIST_SHAPE) -> np.ndarray:
    """Ink float[H, W] (light on dark) -> uint8[*shape], made as MNIST was (module docstring)."""
    side = MNIST_SHAPE[0]
    box_side = BOX if tuple(shape) == MNIST_SHAPE else max(1, round(BOX * min(shape) / side))
    rows, cols = np.flatnonzero(values.any(axis=1)), np.flatnonzero(values.any(axis=0))
    if rows.size == 0:
        raise NoDigit("no digit found: the image is blank")
    crop = values[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
    height, width = crop.shape
    factor = box_side / max(height, width)
    size = (max(1, round(width * factor)), max(1, round(height * factor)))  # PIL: (w, h)
    box = np.asarray(Image.fromarray(crop, mode="F").resize(size, Image.Resampling.BILINEAR))
    box = np.clip(box, 0.0, 1.0)
    mass = box.sum()
    if mass <= 0:
        raise NoDigit(f"no digit found: the strokes vanish at {box_side}x{box_side}")
    centre_row = (box.sum(axis=1) @ np.arange(box.shape[0])) / mass
    centre_col = (box.sum(axis=0) @ np.arange(box.shape[1])) / mass
    top = _place(CENTRE * shape[0] / side - centre_row, box.shape[0], shape[0])
    left = _place(CENTRE * shape[1] / side - centre_col, box.shape[1], shape[1])
    field = np.zeros(shape, np.float32)
    field[top:top + box.shape[0], left:left + box.shape[1]] = box
    return np.round(field * MAX_LEVEL).astype(np.uint8)


def _place(offset: float, extent: int, field: int) -> int:
    """Integer offset that puts the centre of mass nearest its place with the box inside the
    field."""
    return int(min(max(math.floor(offset + 0.5), 0), field - extent))


def as_is(gray: np.ndarray, shape: tuple[int, int] = MNIST_SHAPE) -> np.ndarray:
    """A luminance picture of `shape` (28x28) taken as it is (light digit on dark, like MNIST)
    -> uint8; a blank one (all within MIN_CONTRAST of one level) is refused as with
    prepare=mnist."""
    if gray.shape != tuple(shape):
        raise WrongSize(f"prepare=none takes a {shape[1]}x{shape[0]} image as it is; this one "
                        f"is {gray.shape[1]}x{gray.shape[0]} (use prepare=mnist to fit it)")
    spread = float(gray.max() - gray.min())
    if spread < MIN_CONTRAST:
        raise NoDigit(f"no digit found: the image is blank (its levels span {spread:.2f}; at "
                      f"least {MIN_CONTRAST} of full scale is needed)")
    return np.round(gray * MAX_LEVEL).astype(np.uint8)


def _rgb(image: Image.Image) -> Image.Image:
    """The loaded picture in 8-bit RGB, transparency laid over white."""
    if image.mode.startswith("I"):  # 16-bit grey: its high byte, as `_luminance` reads it
        image = Image.fromarray((np.clip(np.asarray(image), 0, 65535) >> 8).astype(np.uint8))
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(canvas, rgba).convert("RGB")
    return image.convert("RGB")


def fit(picture: Image.Image, shape: tuple[int, ...]) -> np.ndarray:
    """The whole picture cropped to `shape`'s aspect ratio about its centre and resized to it:
    uint8[h, w] (luminance) or uint8[h, w, 3]."""
    height, width = shape[:2]
    fitted = ImageOps.fit(picture, (width, height), Image.Resampling.LANCZOS)
    return np.asarray(fitted if len(shape) == 3 else fitted.convert("L"), np.uint8)


def as_is_rgb(picture: Image.Image, shape: tuple[int, int, int]) -> np.ndarray:
    """An RGB picture of exactly `shape` (h, w, 3) taken as it is -> uint8[h, w, 3]."""
    if picture.size != (shape[1], shape[0]):
        raise WrongSize(f"prepare=none takes a {shape[1]}x{shape[0]} image as it is; this one "
                        f"is {picture.size[0]}x{picture.size[1]} (use prepare=fit to fit it)")
    return np.asarray(picture, np.uint8)


def prepare_digit(data: bytes, prepare: Prepare = "mnist", max_pixels: int = MAX_INPUT_PIXELS,
                  *, shape: tuple[int, ...] = MNIST_SHAPE) -> np.ndarray:
    """PNG/JPEG bytes -> uint8[*shape], the served dataset's `stored_shape`: (h, w), light
    digit on black, or (h, w, 3) in colour; raises an `ImageInputError`. `prepare="mnist"`
    is for grey shapes only (the caller checks: it is a parameter, not a picture, problem)."""
    if prepare == "fit":
        return fit(read_picture(data, _rgb, max_pixels), shape)
    if len(shape) == 3:
        return as_is_rgb(read_picture(data, _rgb, max_pixels), shape)
    gray = read_gray(data, max_pixels)
    if prepare == "none":
        return as_is(gray, shape)
    return to_mnist(ink(gray), shape)
