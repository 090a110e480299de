"""`cvae data`'s flags and command: a built-in dataset (`--dataset`), or one's own images
(`--from PATH --name NAME`, `cvae.data.own`). Standard library only at import (cvae/cli.py
loads it for every command)."""

from __future__ import annotations

import argparse

from cvae import limits
from cvae.cli.types import bounded
from cvae.data.specs import DEFAULT_TEST_FRACTION, SPECS
from cvae.errors import DataError

MAX_SIDE = 4096  # pixels of --image-size's height or width


def parse_image_size(text: str) -> tuple[int, int]:
    """argparse type for --image-size: "32" -> (32, 32); "28x32" -> (28, 32), height x width."""
    parts = text.lower().split("x")
    if len(parts) not in (1, 2) or not all(part.isdigit() and 0 < int(part) <= MAX_SIDE
                                           for part in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: expected N or HxW, each 1..{MAX_SIDE}")
    return (int(parts[0]), int(parts[-1]))


def add_data_flags(data: argparse.ArgumentParser) -> None:
    """The flags of `cvae data`; its parser (description, examples) comes from cvae/cli.py."""
    data.add_argument("--data-dir", default="data",
                      help="where prepared datasets go (default data)")
    data.add_argument("--dataset", choices=tuple(SPECS), default=None,
                      help="which built-in dataset to prepare (default mnist)")
    own = data.add_argument_group("your own images (docs/own-images.md)")
    own.add_argument("--from", dest="source_path", metavar="PATH",
                     help="an image folder (one subfolder per class), an .npz (images, labels, "
                          "class_names) or a folder of IDX files")
    own.add_argument("--name", help="the dataset's name: DATA_DIR/NAME, and `cvae train "
                                    "--dataset NAME`")
    own.add_argument("--image-size", type=parse_image_size, metavar="N|HxW",
                     help="resize every image to this (default: the most common size)")
    own.add_argument("--channels", type=int, choices=(1, 3),
                     help="1 grey, 3 colour (default: from the pixels: colour if any image has "
                          "channels that differ anywhere, else grey)")
    own.add_argument("--background", default="white", metavar="COLOUR",
                     help="what transparent pixels are composited onto: a colour name (white, "
                          "black, grey, ...) or #rrggbb (default white)")
    own.add_argument("--skip-bad", action="store_true",
                     help="leave out files that are not images or do not decode, and list them")
    own.add_argument("--test-fraction", type=bounded(float, 0, 1, low_open=True),
                     default=DEFAULT_TEST_FRACTION, metavar="F",
                     help="without train/ and test/ folders: the share of each class held out "
                          f"for testing (default {DEFAULT_TEST_FRACTION})")
    own.add_argument("--seed", type=bounded(int, 0, limits.MAX_SEED), default=0,
                     help="the seed of that split (default 0)")


def cmd_data(args) -> int:
    if args.source_path is None:
        from cvae.data.prepare import prepare_dataset

        if args.name is not None:
            raise DataError("--name names a dataset prepared --from PATH: give --from too")
        prepare_dataset(args.data_dir, args.dataset or "mnist")
        return 0
    from cvae.data.own import prepare_own

    if args.dataset is not None or args.name is None:
        raise DataError("--from PATH takes --name NAME (not --dataset, which names a built-in)")
    prepare_own(args.source_path, args.name, args.data_dir, image_size=args.image_size,
                channels=args.channels, background=args.background, skip_bad=args.skip_bad,
                test_fraction=args.test_fraction, seed=args.seed)
    return 0
