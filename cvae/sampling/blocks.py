"""Fixed row blocks for the sampler's device calls, and the check that makes them safe.

The sampler (cvae/sampling/sampler.py) runs every jitted function (decode, code decode, prior
mapping, encode) on padded blocks of a few fixed sizes, so that a seeded request gets the same bits
alone or batched with others. That needs one property of the compiled programs: a row's output
bits depend neither on the block size nor on the row's position in the block. XLA's CPU dots
do not promise it. They run in YNNPACK, whose kernels are picked at run time from the CPU's
features, and the same program gave other bits for rows 64-127 of a 128-row block than for
rows 0-63 on an AVX2 machine, while every row agreed on an AVX-512 one. So the property is
checked on the machine that runs the sampler (`block_check`), every row position of every
block size, and what disagrees is dropped. When no size passes, rows are decoded one per call:
one program, one position, the same bits by construction.

Synopsis:

    plan_blocks(200, (64, 128, 256))       # (128, 64, 64)? the cheapest cover of 200 rows
    outcome = block_check(group_probes(sampler, "drawing"), sampler.variables, DECODE_BLOCKS)
    # BlockCheck(kept=..., dropped=..., signature=...); each of GROUPS gets a check of its own
    quick = block_check(probes, variables, DECODE_BLOCKS, first_only=True)  # one size compiled
    outcome = check_remaining(probes, variables, quick)                     # the rest, later
"""

from __future__ import annotations

import functools
import hashlib
from typing import Callable, NamedTuple

import numpy as np

# XLA's CPU dot picks its kernel by shape: sizes of 56 rows or more shared one kernel on the
# machine this was written on (smaller blocks did not), so these are the candidates that
# `block_check` verifies wherever the sampler runs.
DECODE_BLOCKS = (64, 128, 256, 512, 1024)
ROW_BY_ROW = (1,)  # the fallback when no block size keeps a row's bits at every position
# What a sampler checks when it loads (`Sampler.check_blocks`): every size of every group, or
# the first size kept of drawing's alone (a server and `cvae sample`: the rest later, or at
# their first use).
CHECKS = ("all", "first")
# The groups of functions whose block sizes are checked apart, each against its own reference
# bits: drawing (`decode`: what `/sample` needs, checked before a server answers); codes (the
# prior's mapping, code decode and encode: walks and transfers); reading (`classify`).
GROUPS = ("drawing", "codes", "reading")
_CALL_COST_ROWS = 8  # one more device call costs about as much as decoding 8 more rows
_TEST_ROWS = 3  # distinct rows each block size is checked with, labelled 0, 1, 2 (mod classes)


@functools.lru_cache(maxsize=4096)
def plan_blocks(rows: int, sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The block sizes that cover `rows` rows most cheaply (padded rows + call overhead)."""
    if rows <= 0:
        return ()
    largest = max(sizes)
    full, rest = divmod(rows, largest)
    if full:
        return (largest,) * full + plan_blocks(rest, sizes)
    options = [(min(s for s in sizes if s >= rows),)]
    fitting = [s for s in sizes if s <= rows]
    if fitting:
        options.append((max(fitting), *plan_blocks(rows - max(fitting), sizes)))
    return min(options, key=lambda plan: sum(plan) + _CALL_COST_ROWS * len(plan))


class BlockCheck(NamedTuple):
    kept: tuple[int, ...]  # the sizes to decode with (`ROW_BY_ROW` when none passed)
    dropped: tuple[int, ...]
    # The bits the kept sizes give the test rows: equal on two machines whose kernels round
    # alike, so it can stand for "these kernels" in a fingerprint of what decides the output.
    signature: bytes
    unchecked: tuple[int, ...] = ()  # sizes `first_only` left for `check_remaining`


class Probe(NamedTuple):
    """A function the sampler runs through blocks, and what its rows are."""

    fn: Callable  # jitted fn(variables, rows f32[B, width], labels i32[B]) -> array or tuple
    width: int  # D of a row
    # The labels it takes: 0..classes - 1, the model's. The test rows are labelled 0, 1, 2
    # mod classes: a 2-class model is checked on labels it has (0, 1, 0), and a model of three
    # or more classes on 0, 1, 2, as before, so its kernel signature (in its ETags) is unchanged.
    classes: int


def block_check(probes: list[Probe], variables: dict, sizes: tuple[int, ...], *,
                first_only: bool = False) -> BlockCheck:
    """Which `sizes` give every test row the same bits at every position, for every function
    in `probes` (see the module docstring).

    Sizes are checked smallest first. Each is summarised by the bits its blocks give the test
    rows, or None when a row's bits differ between two positions of one block (filled with
    copies of the row, or with the distinct test rows in turn). The first size that passes sets
    the reference bits, and a later size is kept when it gives the same ones: every kept size
    then gives a row one set of bits, so which of them a batch is cut into does not matter.
    `first_only` stops at the first kept size and leaves the larger ones `unchecked`, for
    `check_remaining` to add later: a process can answer after compiling one size, not all.
    """
    ordered = tuple(sorted(sizes))
    for index, size in enumerate(ordered):
        signature = block_signature(probes, variables, size)
        if signature is not None:
            reference = BlockCheck((size,), ordered[:index], signature, ordered[index + 1:])
            return reference if first_only else check_remaining(probes, variables, reference)
    return BlockCheck(ROW_BY_ROW, ordered, block_signature(probes, variables, 1))


def check_remaining(probes: list[Probe], variables: dict, outcome: BlockCheck) -> BlockCheck:
    """`outcome` with its unchecked sizes checked against its reference bits: each kept when it
    gives the test rows the same bits at every position, else dropped."""
    kept, dropped = list(outcome.kept), list(outcome.dropped)
    for size in outcome.unchecked:
        same = block_signature(probes, variables, size) == outcome.signature
        (kept if same else dropped).append(size)
    return BlockCheck(tuple(kept), tuple(sorted(dropped)), outcome.signature)


def group_probes(sampler, group: str) -> list[Probe]:
    """The functions of one of `GROUPS` that a `cvae.sampling.sampler.Sampler` runs through
    blocks, with their row widths (draws: noise; codes: a code; encode, classify: pixels)."""
    if group == "reading":
        return classify_probes(sampler)
    classes = len(sampler.classes)
    if group == "drawing":
        return [Probe(sampler.decode_fn, sampler.noise_dim, classes)]
    widths = ((sampler.prior_fn, sampler.noise_dim), (sampler.code_decode_fn, sampler.code_dim),
              (sampler.encode_fn, sampler.image_pixels))
    return [Probe(fn, width, classes) for fn, width in widths if fn is not None]


def sampler_probes(sampler) -> list[Probe]:
    """Drawing's and codes' functions, in the order kernel signatures were first recorded in
    (before they were checked apart): decode, the prior's mapping, code decode, encode."""
    return group_probes(sampler, "drawing") + group_probes(sampler, "codes")


def classify_probes(sampler) -> list[Probe]:
    """The sampler's reading of digits, checked apart from the other groups: Bayes' rule runs
    encoder and decoder over every class of the model a row, so its dots meet other shapes, and
    a block size it cannot keep need not be lost to drawing."""
    if sampler.classify_fn is None:
        return []
    classify = sampler.classify_fn  # q(y|x) of a few-label model, or Bayes' rule: no labels
    return [Probe(lambda variables, images, labels: classify(variables, images),
                  sampler.image_pixels, len(sampler.classes))]


def block_signature(probes: list[Probe], variables: dict, size: int) -> bytes | None:
    """A digest of the bits each test row gets in blocks of `size` rows; None when some row
    gets other bits at another position."""
    digest = hashlib.sha256()
    for fn, width, classes in probes:
        rows = np.random.default_rng(width).random((_TEST_ROWS, width), np.float32)
        labels = np.arange(_TEST_ROWS, dtype=np.int32) % classes  # the model's labels only
        cycle = np.arange(size) % _TEST_ROWS  # distinct rows, each at every third position
        mixed = _outputs(fn, variables, rows=rows[cycle], labels=labels[cycle])
        for row in range(_TEST_ROWS):
            copies = _outputs(fn, variables, rows=np.repeat(rows[row:row + 1], size, axis=0),
                              labels=np.full(size, labels[row], np.int32))
            for same, among in zip(copies, mixed):
                expected = np.broadcast_to(same[:1], same.shape)
                if not (np.array_equal(same, expected)
                        and np.array_equal(among[cycle == row], expected[cycle == row])):
                    return None
                digest.update(same[0].tobytes())
    return digest.digest()


def _outputs(fn: Callable, variables: dict, *, rows: np.ndarray, labels: np.ndarray
             ) -> list[np.ndarray]:
    """fn's outputs on one block, as unsigned integers (so bits compare, NaN and -0.0 too)."""
    out = fn(variables, rows, labels)
    return [np.asarray(value).view(np.uint32) for value in (out if isinstance(out, tuple)
                                                             else (out,))]
