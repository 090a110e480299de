"""argparse value types of the `cvae` command: a number checked against its range, naming the
range when it is out of it; and the flags that `cvae sample`, `eval`, `serve` and `export`
share. Standard library only, so `--help` stays instant."""

from __future__ import annotations

import argparse


def bounded(kind: type, low=None, high=None, *, low_open: bool = False):
    """argparse type: parse `kind` and check low <= value <= high, naming the range on failure."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {kind.__name__}")
        too_low = low is not None and (value <= low if low_open else value < low)
        if too_low or (high is not None and value > high):
            left = "(" if low_open else "["
            raise argparse.ArgumentTypeError(
                f"{value} is outside {left}{_number(low)}, {_number(high)}]")
        return value
    return parse


def _number(x) -> str:
    """2.0 -> "2"; ints and None as they are."""
    return f"{x:g}" if isinstance(x, float) else str(x)


def add_truncation_flag(parser: argparse.ArgumentParser) -> None:
    """--truncation Q: draw at another truncation than the run's own (`Config.drawn_at`)."""
    parser.add_argument("--truncation", type=bounded(float, 0, 1, low_open=True), metavar="Q",
                        help="pull each sample's noise in onto the radius that a share Q of "
                             "N(0, I)'s draws lie within, instead of the run's own truncation "
                             "(1 = none; default: the run's, 0.75 for `make train`)")


def add_compilation_cache_flag(parser: argparse.ArgumentParser) -> None:
    """--compilation-cache DIR|off: where compiled programs are kept between processes."""
    parser.add_argument("--compilation-cache", metavar="DIR",
                        help="keep compiled programs in DIR for the next process on this "
                             "machine, and read them from it: a start compiles nothing it "
                             "compiled before (`off`: compile everything; default "
                             "$CVAE_COMPILATION_CACHE, else ~/.cache/cvae/xla)")


STEP_WORDS = ("latest", "best")


def step_choice(text: str) -> int | str:
    """argparse type for --step: `latest`, `best` or a step number (`store.StepChoice`)."""
    if text in STEP_WORDS:
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a step number, latest or best")
    return int(text)


def add_step_flag(parser: argparse.ArgumentParser, *, served: bool = False) -> None:
    """--step N|best|latest: which checkpoint step to read; `served`: how the service follows
    new steps under each choice."""
    if served:
        text = ("which step to serve: N (that step, never rolled forward), best (the lowest "
                "validation loss, moving to a new best as it lands) or latest (the newest, "
                "moving to each new step; default)")
    else:
        text = ("which checkpoint step: N, best (the lowest validation loss, as training keeps "
                "it) or latest (the newest; default)")
    parser.add_argument("--step", type=step_choice, default="latest", metavar="N|best|latest",
                        help=text + "; a missing N is refused, listing the steps there")
