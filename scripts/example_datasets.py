"""The three real data sets that show `cvae data --from` on data a person would have, written
the way such a person keeps them (docs/own-images.md):

- `digits`: scikit-learn's `load_digits`, 1,797 real 8x8 handwritten digits (shipped inside the
  scikit-learn wheel; the `examples` extra), as an .npz with `images`, `labels` and
  `class_names`. Its pixels are levels 0..16, written as uint8 by round(v * 255 / 16).
- `fashion`: Fashion-MNIST's IDX files (Debian's dataset-fashion-mnist) written out as an image
  folder of PNGs, `train/<class>/` and `test/<class>/`, one folder per class named after it
  ("/" in "T-shirt/top" becomes "-": a folder name cannot hold it).
- `colour`: 32x32 colour digits made from `load_digits`, seeded: each digit upscaled to a
  random size, tinted a random colour and placed at a random spot on a background of another
  random colour, as an .npz. The colours are synthetic; the digits' shapes are real.
- `emoji`: the 3,786 64x64 Google (Noto) emoji PNGs of the npm package
  `emoji-datasource-google@16.0.0` (`npm pack` fetches it; images Apache-2.0, the package MIT),
  as `train/<category>/` and `test/<category>/` folders of the PNGs as they are, transparent
  around the figure. The class is `emoji.json`'s `category`; the test set is a fifth of each
  category's base emoji (`unified`), chosen as `cvae data` chooses a test set by class
  (`seeded_test_split`), each with all its skin-tone variants, so that no variant sits on the
  other side of its base.

Usage: python scripts/example_datasets.py digits|fashion|colour|emoji OUT [--limit N] [--seed S]
       [--source PATH]
Then: cvae data --from OUT --name NAME
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

from cvae.data.idx import (TEST_IMAGES, TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS,
                           find_idx_files, read_idx)
from cvae.data.prepare import FASHION_MNIST_DEBIAN_DIR
from cvae.data.specs import DEFAULT_TEST_FRACTION, FASHION
from cvae.data.splits import seeded_test_split

DIGIT_LEVELS = 16  # load_digits' pixels are 0..16
COLOUR_SIZE = 32
DIGIT_SIZES = (16, 28)  # the upscaled digit's side, drawn from this range (inclusive)
MIN_CONTRAST = 80  # the least mean difference over R, G, B between a tint and its background
EMOJI_PACKAGE = "emoji-datasource-google-16.0.0.tgz"  # `npm pack emoji-datasource-google@16.0.0`
EMOJI_IMAGES = "package/img/google/64/"  # in the package: one PNG per emoji and variant


def load_digits_uint8() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as uint8[1797, 8, 8] and int64[1797] labels 0..9."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("scikit-learn is needed: pip install -e '.[examples]'")
    digits = load_digits()
    images = np.rint(digits.images * 255 / DIGIT_LEVELS).astype(np.uint8)
    return images, digits.target.astype(np.int64)


def write_digits(out: Path, limit: int | None = None) -> Path:
    """The digits (the first `limit` of them) as an .npz with class names "0".."9"."""
    images, labels = load_digits_uint8()
    np.savez(out, images=images[:limit], labels=labels[:limit],
             class_names=np.array([str(d) for d in range(10)]))
    return out


def write_fashion(out: Path, source: Path = FASHION_MNIST_DEBIAN_DIR,
                  limit: int | None = None) -> Path:
    """Fashion-MNIST's IDX files in `source` as out/{train,test}/<class>/<index>.png (the first
    `limit` of each split)."""
    files = find_idx_files(Path(source))
    if files is None:
        sys.exit(f"{source}: Fashion-MNIST IDX files not found: apt-get install "
                 f"dataset-fashion-mnist")
    folders = [name.replace("/", "-") for name in FASHION]
    for split, images_key, labels_key in (("train", TRAIN_IMAGES, TRAIN_LABELS),
                                          ("test", TEST_IMAGES, TEST_LABELS)):
        images, labels = read_idx(files[images_key])[:limit], read_idx(files[labels_key])[:limit]
        for folder in folders:
            (out / split / folder).mkdir(parents=True, exist_ok=True)
        for index, (image, label) in enumerate(zip(images, labels)):
            Image.fromarray(image).save(out / split / folders[label] / f"{index:05d}.png")
    return out


def _colour_pair(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A tint and a background colour far enough apart for the digit to show."""
    while True:
        tint, background = rng.integers(0, 256, (2, 3))
        if np.abs(tint - background).mean() >= MIN_CONTRAST:
            return tint.astype(np.float32), background.astype(np.float32)


def colour_digit(digit: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """uint8[8, 8] grey digit -> uint8[32, 32, 3]: upscaled, tinted, placed on a background."""
    side = int(rng.integers(DIGIT_SIZES[0], DIGIT_SIZES[1] + 1))
    ink = np.asarray(Image.fromarray(digit).resize((side, side), Image.Resampling.BILINEAR),
                     np.float32) / 255
    top, left = rng.integers(0, COLOUR_SIZE - side + 1, 2)
    alpha = np.zeros((COLOUR_SIZE, COLOUR_SIZE, 1), np.float32)
    alpha[top:top + side, left:left + side, 0] = ink
    tint, background = _colour_pair(rng)
    return np.rint(background * (1 - alpha) + tint * alpha).astype(np.uint8)


def write_colour(out: Path, limit: int | None = None, seed: int = 0) -> Path:
    """The digits (the first `limit`) as 32x32 colour images in an .npz, seeded."""
    images, labels = load_digits_uint8()
    rng = np.random.default_rng(seed)
    coloured = np.stack([colour_digit(digit, rng) for digit in images[:limit]])
    np.savez(out, images=coloured, labels=labels[:limit],
             class_names=np.array([str(d) for d in range(10)]))
    return out


def emoji_files(entries: list[dict]) -> dict[str, list[str]]:
    """Each base emoji's `unified` code -> the image files of it and its skin-tone variants,
    for the entries the package has a Google image of."""
    files = {}
    for entry in entries:
        if entry.get("has_img_google"):
            variants = entry.get("skin_variations", {}).values()
            files[entry["unified"]] = [entry["image"]] + [
                v["image"] for v in variants if v.get("has_img_google")]
    return files


def write_emoji(out: Path, package: Path, seed: int = 0, limit: int | None = None) -> Path:
    """The package's PNGs (`package`: the .tgz of `npm pack`) as train/ and test/ class folders,
    split by base emoji within each category; `limit`: the first N base emoji of a category (a
    category of one keeps it for training)."""
    with tarfile.open(package) as tar:
        entries = json.load(tar.extractfile("package/emoji.json"))
        files = emoji_files(entries)
        bases = collections.defaultdict(list)  # category -> its base emoji
        for entry in entries:
            if entry["unified"] in files:
                bases[entry["category"]].append(entry["unified"])
        categories = sorted(bases)
        kept = [bases[category][:limit] for category in categories]
        codes = [code for codes_of in kept for code in codes_of]
        labels = np.repeat(np.arange(len(categories)), [len(codes_of) for codes_of in kept])
        test = seeded_test_split(labels, DEFAULT_TEST_FRACTION, seed)  # `cvae data`'s own rule
        folders = {name: out / ("test" if held_out else "train") / categories[label]
                   for code, label, held_out in zip(codes, labels, test)
                   for name in files[code]}  # image file -> where it goes
        for member in tar:  # one pass: a .tgz is read from its start at every seek back
            name = member.name.removeprefix(EMOJI_IMAGES)
            if member.name.startswith(EMOJI_IMAGES) and name in folders:
                folders[name].mkdir(parents=True, exist_ok=True)
                (folders[name] / name).write_bytes(tar.extractfile(member).read())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=("digits", "fashion", "colour", "emoji"))
    parser.add_argument("out", type=Path,
                        help="the .npz (digits, colour) or folder (fashion, emoji)")
    parser.add_argument("--limit", type=int, help="the first N images only (of each split; "
                        "emoji: base emoji of each category)")
    parser.add_argument("--seed", type=int, default=0,
                        help="colour: the colours' seed; emoji: the split's")
    parser.add_argument("--source", type=Path, help="fashion: the folder of its IDX files "
                        f"(default {FASHION_MNIST_DEBIAN_DIR}); emoji: the package's .tgz "
                        f"(default {EMOJI_PACKAGE})")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.kind == "digits":
        write_digits(args.out, args.limit)
    elif args.kind == "fashion":
        write_fashion(args.out, args.source or FASHION_MNIST_DEBIAN_DIR, args.limit)
    elif args.kind == "emoji":
        write_emoji(args.out, args.source or Path(EMOJI_PACKAGE), args.seed, args.limit)
    else:
        write_colour(args.out, args.limit, args.seed)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
