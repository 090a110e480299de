"""`cvae data --from PATH --name NAME`: a person's labelled images, prepared once into the data
folder in the project's own format (`cvae.data.prepared`), so that `cvae train --dataset NAME`
trains on them.

The data flows: the source is read without its pixels (`cvae.data.sources`), checked (two or
more classes, none empty, the data set fits in memory), planned (one image size, one mode, the
test split), then written image by image into preallocated memory maps inside a hidden
temporary folder beside the target, which is renamed into place only once everything,
manifest included, is written. Any failure removes the temporary folder: the data folder
changes only when preparation succeeds.

- Size: `--image-size`, or else the most common size among the images (ties: the first one
  met); other sizes are resized with Pillow's LANCZOS filter, aspect ratio not kept.
- Transparency: an image with an alpha channel (RGBA, LA, PA) or a transparent colour (a palette
  or PNG `transparency`) is made RGBA by Pillow's `convert` and alpha-composited
  (`Image.alpha_composite`) onto an opaque `--background` (default white) before anything
  else, so the colour hidden under transparent pixels never shows. In a grey data set the
  composite is then made grey like any colour image, so the background becomes its grey level.
- Mode: `--channels`, or else 1 (L) when every image is in a grey mode or every colour image's
  three channels are equal everywhere, exactly, after decoding and compositing (grey saved as
  colour: said in one line and in the manifest), and 3 (RGB) as soon as one colour image has a
  pixel whose channels differ by even one level. Other modes are converted with Pillow's
  `convert` (grey made RGB by repeating it; RGB made grey by ITU-R 601-2 luma, which gives
  back the level itself when the three channels are equal; a mode with no direct conversion,
  LAB to L say, through RGB).
- Split: the source's own (train/ and test/ folders, IDX files), or else, in each class, the
  `--test-fraction` of its images whose hash of (--seed, index) is lowest
  (`cvae.data.splits.seeded_test_split`); every class keeps a training image.
No JAX here.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import secrets
import shutil
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageColor
from tqdm import tqdm

from cvae.data import prepared, specs
from cvae.data.specs import DEFAULT_TEST_FRACTION
from cvae.data.idx import TEST_IMAGES, TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS
from cvae.data.memory import check_fits
from cvae.data.prepare import Log
from cvae.data.sources import GREY_MODES, Source, check_classes, open_source
from cvae.data.splits import seeded_test_split
from cvae.errors import DataError

RESIZE_FILTER = Image.Resampling.LANCZOS
DEFAULT_BACKGROUND = "white"
# Modes that carry an alpha channel; any other mode is transparent only through
# `info["transparency"]` (a palette entry, or one grey level or colour in a PNG).
ALPHA_MODES = ("RGBA", "RGBa", "LA", "La", "PA")
MODES = {1: "L", 3: "RGB"}  # channels -> the Pillow mode images are converted to
CHANNELS = {mode: channels for channels, mode in MODES.items()}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_COPY_ROWS = 4096  # images copied at once when an array source needs no conversion


def _warn(line: str) -> None:
    print(line, file=sys.stderr)


def parse_background(text: str) -> tuple[int, int, int]:
    """--background: a colour name Pillow's ImageColor knows ("white", "black", "grey",
    "navy", ...) or #rrggbb (also #rgb, rgb(...), hsl(...)) -> (r, g, b); DataError otherwise,
    or when it is not opaque."""
    try:
        colour = ImageColor.getrgb(text)
    except (ValueError, AttributeError):
        raise DataError(f"--background {text!r}: not a colour: give a name such as white, "
                        f"black or grey, or #rrggbb") from None
    if len(colour) == 4 and colour[3] != 255:
        raise DataError(f"--background {text!r}: must be opaque (it replaces transparency)")
    return tuple(colour[:3])


def _flattened(image: Image.Image, background: tuple[int, int, int]
               ) -> tuple[Image.Image, bool]:
    """`image` with any transparency alpha-composited onto the opaque `background` (then RGB),
    or `image` itself when it has none; and whether it had a pixel not fully opaque."""
    if image.mode not in ALPHA_MODES and "transparency" not in image.info:
        return image, False
    rgba = image.convert("RGBA")  # Pillow's own: a palette's or a PNG's transparency -> alpha
    transparent = rgba.getextrema()[3][0] < 255
    base = Image.new("RGBA", rgba.size, (*background, 255))
    return Image.alpha_composite(base, rgba).convert("RGB"), transparent


def _grey_level(rgb: tuple[int, int, int]) -> int:
    """The grey level Pillow's RGB -> L conversion (ITU-R 601-2 luma) gives the colour `rgb`:
    the background a grey data set's transparent pixels become."""
    return Image.new("RGB", (1, 1), tuple(rgb)).convert("L").getpixel((0, 0))


def _equal_channels(pixels: np.ndarray) -> bool:
    """True when every pixel of uint8[..., 3] has three equal channels, exactly."""
    return bool(np.array_equal(pixels[..., 0], pixels[..., 1])
                and np.array_equal(pixels[..., 1], pixels[..., 2]))


@dataclasses.dataclass(frozen=True)
class Plan:
    """What preparation makes of a source: every image at `size` (height, width) in `mode`,
    its transparency composited onto `background` (r, g, b); test: bool[N], True for the
    images held out for testing. grey_from_colour: how many colour images were made grey
    because their three channels are equal everywhere."""

    size: tuple[int, int]
    mode: str
    test: np.ndarray
    size_rule: str
    split: dict
    background: tuple[int, int, int] = (255, 255, 255)
    mode_rule: str = "--channels"
    grey_from_colour: int = 0

    @property
    def channels(self) -> int:
        return CHANNELS[self.mode]

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """One image as written: (height, width) for grey, (height, width, 3) for colour."""
        return self.size if self.channels == 1 else (*self.size, self.channels)


def _check_target(data_dir: Path, name: str) -> Path:
    if not _NAME.fullmatch(name):
        raise DataError(f"--name {name!r}: use letters, digits, '_', '.' and '-' (up to 64), "
                        f"starting with a letter or digit")
    if name in specs.SPECS or name in {spec.folder for spec in specs.SPECS.values()}:
        raise DataError(f"--name {name!r} is a built-in dataset: choose another name")
    target = prepared.folder_of(data_dir, name)
    if target.exists():
        raise DataError(f"{target} already exists: remove it, or choose another --name")
    return target


def _first_colour(source: Source, rows: np.ndarray, background: tuple[int, int, int], *,
                  progress: bool) -> int | None:
    """The first of `rows` (images in a colour mode) whose pixels, composited onto
    `background`, have two channels that differ anywhere; None when there is none."""
    if source.array is not None:  # uint8 (N, H, W, 3) in memory: a block at a time
        for start in range(0, len(rows), _COPY_ROWS):
            block = rows[start:start + _COPY_ROWS]
            pixels = source.array(block)
            if not _equal_channels(pixels):
                unequal = ~((pixels[..., 0] == pixels[..., 1])
                            & (pixels[..., 1] == pixels[..., 2])).reshape(len(block), -1)
                return int(block[np.flatnonzero(unequal.any(axis=1))[0]])
        return None
    for row in tqdm(rows, desc="checking channels", unit="img",
                    disable=None if progress else True):
        try:
            image, _ = _flattened(source.image(row), background)
            pixels = np.asarray(image.convert("RGB"), np.uint8)
        except ValueError as error:
            raise DataError(f"{source.where(row)}: cannot be made RGB ({error})") from None
        if not _equal_channels(pixels):
            return int(row)
    return None


def _mode(source: Source, channels: int | None, background: tuple[int, int, int], *,
          progress: bool) -> tuple[int, str, int]:
    """(channels, the rule that chose them, how many colour images are made grey because
    their channels are equal everywhere)."""
    if channels is not None:
        return channels, "--channels", 0
    colour = np.array([mode not in GREY_MODES for mode in source.modes], bool)
    if not colour.any():
        return 1, "every image is in a grey mode", 0
    first = _first_colour(source, np.flatnonzero(colour), background, progress=progress)
    if first is not None:
        return 3, f"colour: {source.where(first)} has channels that differ", 0
    return 1, ("grey: every colour image has three equal channels everywhere, after "
               "decoding and compositing its transparency"), int(colour.sum())


def plan(source: Source, *, image_size: tuple[int, int] | None, channels: int | None,
         test_fraction: float, seed: int, background: tuple[int, int, int] = (255, 255, 255),
         progress: bool = False) -> Plan:
    """One size, one mode and the split for every image of `source` (module docstring)."""
    if image_size is None:
        sizes = collections.Counter(map(tuple, source.sizes.tolist()))
        size, rule = sizes.most_common(1)[0][0], "the most common size (ties: the first met)"
    else:
        size, rule = image_size, "--image-size"
    channels, mode_rule, grey_from_colour = _mode(source, channels, background,
                                                  progress=progress)
    if source.test is not None:
        test, split = source.test, {"rule": f"the source's own ({source.kind})"}
    else:
        test = seeded_test_split(source.labels, test_fraction, seed)
        split = {"rule": "per class, the test fraction of its images whose hash of (seed, "
                         "index) is lowest", "test_fraction": test_fraction, "seed": seed}
    return Plan(tuple(size), MODES[channels], test, rule, split, tuple(background), mode_rule,
                grey_from_colour)


def _converted(image: Image.Image, plan: Plan) -> tuple[np.ndarray, bool]:
    """`image` in the plan's mode and size, as uint8[H, W] or [H, W, 3], its transparency
    composited onto the plan's background; and whether it had a pixel not fully opaque."""
    image, transparent = _flattened(image, plan.background)
    if image.mode != plan.mode:
        try:
            image = image.convert(plan.mode)
        except ValueError:  # no direct conversion (LAB to L, say): through RGB
            image = image.convert("RGB").convert(plan.mode)
    height, width = plan.size
    if image.size != (width, height):
        image = image.resize((width, height), RESIZE_FILTER)
    return np.asarray(image, np.uint8), transparent


def _convert_row(source: Source, row: int, plan: Plan) -> tuple[np.ndarray, bool]:
    try:
        return _converted(source.image(row), plan)
    except ValueError as error:
        raise DataError(f"{source.where(row)}: cannot be made {plan.mode} at "
                        f"{plan.size[0]}x{plan.size[1]} ({error})") from None


def _write_images(source: Source, plan: Plan, folder: Path, *, progress: bool) -> int:
    """The four arrays, the images one at a time into preallocated memory maps (or, when an
    array source needs no conversion, copied a block at a time); returns how many images had
    a pixel not fully opaque."""
    shape = plan.stored_shape
    transparent = 0
    # An array source's images all share one size and mode.
    as_is = (source.array is not None and source.modes[0] == plan.mode
             and tuple(source.sizes[0].tolist()) == plan.size)
    for test, images_key, labels_key in ((False, TRAIN_IMAGES, TRAIN_LABELS),
                                         (True, TEST_IMAGES, TEST_LABELS)):
        rows = np.flatnonzero(plan.test == test)
        np.save(folder / prepared.FILES[labels_key], source.labels[rows].astype(np.int32))
        out = np.lib.format.open_memmap(folder / prepared.FILES[images_key], mode="w+",
                                        dtype=np.uint8, shape=(len(rows), *shape))
        with tqdm(total=len(rows), desc=f"writing {'test' if test else 'train'}", unit="img",
                  disable=None if progress else True) as bar:
            for start in range(0, len(rows), _COPY_ROWS):
                block = rows[start:start + _COPY_ROWS]
                if as_is:
                    out[start:start + len(block)] = source.array(block)
                else:
                    for offset, row in enumerate(block):
                        out[start + offset], had_alpha = _convert_row(source, row, plan)
                        transparent += had_alpha
                bar.update(len(block))
        out.flush()
        del out
    return transparent


def _manifest(source: Source, plan: Plan, name: str, *, background: str) -> dict:
    sizes = collections.Counter(f"{h}x{w}" for h, w in source.sizes.tolist())
    target = "{}x{}".format(*plan.size)
    modes = collections.Counter(source.modes)
    counts = {split: {class_name: int(np.sum((source.labels == label) & (plan.test == test)))
                      for label, class_name in enumerate(source.class_names)}
              for split, test in (("train", False), ("test", True))}
    return {
        "format": prepared.FORMAT,
        "name": name,
        "source": {"kind": source.kind, "path": str(source.path.absolute())},
        "image_shape": [*plan.size, plan.channels],
        "channels": plan.channels,
        "class_names": list(source.class_names),
        "counts": counts,
        "split": plan.split,
        "resize": {"rule": plan.size_rule, "size": list(plan.size),
                   "filter": f"PIL.Image.Resampling.{RESIZE_FILTER.name}",
                   "resized": {size: n for size, n in sorted(sizes.items()) if size != target}},
        "modes": {"to": plan.mode, "converted": {mode: n for mode, n in sorted(modes.items())
                                                 if mode != plan.mode},
                  "rule": plan.mode_rule, "grey_from_colour": plan.grey_from_colour},
        # "transparent" is counted while the images are written.
        "background": {"colour": background, "rgb": list(plan.background),
                       "grey": _grey_level(plan.background),
                       "rule": "transparency alpha-composited onto it (PIL.Image."
                               "alpha_composite)", "transparent": 0},
        "skipped": [dataclasses.asdict(bad) for bad in source.bad],
    }


def prepare_own(source_path: str | os.PathLike, name: str, data_dir: str | os.PathLike = "data",
                *, image_size: tuple[int, int] | None = None, channels: int | None = None,
                background: str = DEFAULT_BACKGROUND, skip_bad: bool = False,
                test_fraction: float = DEFAULT_TEST_FRACTION, seed: int = 0, log: Log = print,
                warn: Log = _warn, progress: bool = True) -> Path:
    """Prepares the labelled images at `source_path` as dataset `name` in `data_dir/name`, and
    returns that folder. DataError, with nothing written, for a bad source (module docstring);
    files left out with `skip_bad` are listed through `warn` and in the manifest."""
    data_dir = Path(data_dir)
    target = _check_target(data_dir, name)
    if not 0 < test_fraction < 1:
        raise DataError(f"--test-fraction {test_fraction}: must be in (0, 1)")
    if channels not in (None, *MODES):
        raise DataError(f"--channels {channels}: must be 1 or 3")
    rgb = parse_background(background)
    source = open_source(source_path, skip_bad=skip_bad, progress=progress)
    check_classes(source)
    layout = plan(source, image_size=image_size, channels=channels,
                  test_fraction=test_fraction, seed=seed, background=rgb, progress=progress)
    check_fits(source.count * int(np.prod(layout.stored_shape)), where=str(source_path))
    for bad in source.bad:
        warn(f"skipped {bad.path}: {bad.reason}")
    manifest = _manifest(source, layout, name, background=background)
    created = not data_dir.exists()
    data_dir.mkdir(parents=True, exist_ok=True)
    # Hidden, and unique to this run; made by mkdir so that it gets the umask's permissions.
    partial = data_dir / f".{name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        partial.mkdir()
        manifest["background"]["transparent"] = _write_images(source, layout, partial,
                                                              progress=progress)
        manifest["sha256"] = prepared.content_hash(partial, source.class_names)
        (partial / prepared.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        partial.rename(target)  # atomic; fails if another process prepared it meanwhile
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        if created:
            shutil.rmtree(data_dir, ignore_errors=True)
        raise
    _report(manifest, source, target, log=log)
    return target


def _report(manifest: dict, source: Source, target: Path, *, log: Log) -> None:
    counts = {split: sum(manifest["counts"][split].values()) for split in ("train", "test")}
    height, width, channels = manifest["image_shape"]
    names = source.class_names
    shown = ", ".join(names if len(names) <= 10 else [*names[:9], "..."])
    log(f"read {source.count} images in {len(names)} classes ({shown}) from {source.path} "
        f"({source.kind})" + (f"; skipped {len(source.bad)} files" if source.bad else ""))
    resized = sum(manifest["resize"]["resized"].values())
    converted = sum(manifest["modes"]["converted"].values())
    changes = [f"resized {resized} images to {height}x{width} "
               f"({manifest['resize']['filter'].rsplit('.', 1)[-1]})"] if resized else []
    changes += [f"converted {converted} to {manifest['modes']['to']}"] if converted else []
    if changes:
        log("; ".join(changes))
    if manifest["modes"]["grey_from_colour"]:
        log(f"{manifest['modes']['grey_from_colour']} colour images have three equal channels "
            f"everywhere: prepared as grey (1 channel); --channels 3 keeps them in colour")
    background = manifest["background"]
    if background["transparent"]:
        log(f"composited {background['transparent']} images with transparency onto "
            f"{background['colour']} {tuple(background['rgb'])}")
    log(f"prepared {target}: {counts['train']} train + {counts['test']} test images of "
        f"{height}x{width}x{channels}; sha256 {manifest['sha256']}")
    log(f"train on it: cvae train --dataset {manifest['name']} --data-dir {target.parent}")
