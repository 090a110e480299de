"""`cvae sample`'s flags and command: a PNG grid drawn offline, the bytes the service gives for
the same request. Standard library only at import (cvae/cli/main.py loads it for every
command)."""

from __future__ import annotations

import argparse

from cvae import limits
from cvae.cli.export import check_exported
from cvae.cli.types import add_compilation_cache_flag, add_step_flag, add_truncation_flag, bounded


def add_sample_flags(sample: argparse.ArgumentParser) -> None:
    """The flags of `cvae sample`; its parser (description, examples): cvae/cli/main.py."""
    sample.add_argument("--checkpoint-dir", default="checkpoints",
                        help="the run to sample from, or a folder of `cvae export` "
                             "(default checkpoints)")
    add_step_flag(sample)
    which = sample.add_mutually_exclusive_group()  # omit both for one row per class
    which.add_argument("--digit", type=bounded(int, 0, limits.MAX_CLASSES - 1),
                       help="a class by index (the model's own range is checked once loaded)")
    which.add_argument("--label", metavar="NAME|INDEX",
                       help="the class to draw, by its name in the dataset (dog) or its index")
    sample.add_argument("--n", type=bounded(int, 1, limits.MAX_N), default=limits.DEFAULT_N,
                        help=f"samples per digit (default {limits.DEFAULT_N})")
    sample.add_argument("--cols", type=bounded(int, 1, limits.MAX_N),
                        help="grid columns (default ceil(sqrt(n)), or n without --digit)")
    sample.add_argument("--seed", type=bounded(int, 0, limits.MAX_SEED), default=0,
                        help="the same seed gives the same PNG bytes (default 0)")
    sample.add_argument("--temperature", type=bounded(float, 0, limits.MAX_TEMPERATURE,
                                                      low_open=True),
                        default=limits.DEFAULT_TEMPERATURE,
                        help=f"z ~ N(0, t^2 I) (default {limits.DEFAULT_TEMPERATURE})")
    add_truncation_flag(sample)
    add_compilation_cache_flag(sample)
    sample.add_argument("--scale", type=bounded(int, 1, limits.MAX_SCALE),
                        default=limits.DEFAULT_SCALE,
                        help=f"integer upscale of each tile (default {limits.DEFAULT_SCALE})")
    sample.add_argument("--pad", type=bounded(int, 0, limits.MAX_PAD), default=limits.DEFAULT_PAD,
                        help=f"px of background around every tile (default {limits.DEFAULT_PAD})")
    sample.add_argument("--out", required=True, help="output PNG path")


def cmd_sample(args) -> int:
    from cvae.data.specs import spec_of
    from cvae.export.compiled import use_cache
    from cvae.export.load import open_sampler
    from cvae.sampling.grid import grid_columns, make_grid, save_png

    check_exported(args.checkpoint_dir)
    use_cache(args.checkpoint_dir, args.compilation_cache)
    # One block size, decode only: the grid's bits are those of every size a server keeps.
    sampler = open_sampler(args.checkpoint_dir, args.step, truncation=args.truncation,
                           check="first")
    digit = args.digit if args.label is None else sampler.class_index(args.label)
    images = sampler.sample_images(digit, args.n, args.seed, temperature=args.temperature)
    shape = spec_of(sampler.config.data.dataset).stored_shape
    grid = make_grid(images, grid_columns(digit, args.n, args.cols), pad=args.pad,
                     scale=args.scale, image_shape=shape)
    path = save_png(grid, args.out)
    print(f"wrote {path} ({grid.shape[1]}x{grid.shape[0]}, step {sampler.step}, seed {args.seed})")
    return 0
