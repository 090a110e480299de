"""Fixed row blocks for the sampler's device calls, and the check that makes them safe.

The sampler (cvae/sampling/sampler.py) runs every jitted function (decode, code decode, prior
mapping, encode) on padded blocks of a few fixed sizes, so that a seeded request gets the same bits
alone or batched with others. That needs one property of the compiled programs: a row's output
bits depend neither on the block size nor on the row's position in the block. XLA's CPU dots
do not promise it. They run in YNNPACK, whose kernels are picked at run time from the CPU's
features, and the same program gave other bits for rows 64-127 of a 128-row block than for
rows 0-63 on an AVX2 machine, while every row agreed on an AVX-512 one. So the property is
checked on the machine that runs the sampler (`block_check`), every row position of every
block size, on rows drawn as the function's real inputs are as well as on fixed test rows
(a size may round only some rows otherwise), and what disagrees is dropped. When no size
passes, rows are decoded one per call: one program, one position, the same bits by
construction.

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
_TEST_ROWS = 3  # rows checked at every position of a block, labelled 0, 1, 2 (mod classes)
# Rows drawn like the function's real inputs, whose bits every kept size must give (`block_bits`)
_INPUT_ROWS = 128


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
    # The bits the kept sizes give the rows drawn like real inputs (`_INPUT_ROWS`), which a
    # size must give too to be kept.
    agreement: bytes = b""


class Probe(NamedTuple):
    """A function the sampler runs through blocks, and what its rows are."""

    fn: Callable  # jitted fn(variables, rows f32[B, width], labels i32[B]) -> array or tuple
    width: int  # D of a row
    # The labels it takes: 0..classes - 1, the model's. The test rows are labelled 0, 1, 2
    # mod classes: a 2-class model is checked on labels it has (0, 1, 0), and a model of three
    # or more classes on 0, 1, 2, as before, so its kernel signature (in its ETags) is unchanged.
    classes: int
    pixels: bool = False  # rows are images in [0, 1]; else noise or codes, drawn N(0, I)


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
        # A lone size of one row has nothing to compare and one position to check.
        bits = block_bits(probes, variables, size, inputs=len(ordered) > 1 or size > 1)
        if bits is not None:
            reference = BlockCheck((size,), ordered[:index], bits[0], ordered[index + 1:],
                                   bits[1])
            return reference if first_only else check_remaining(probes, variables, reference)
    return BlockCheck(ROW_BY_ROW, ordered, block_signature(probes, variables, 1))


def check_remaining(probes: list[Probe], variables: dict, outcome: BlockCheck) -> BlockCheck:
    """`outcome` with its unchecked sizes checked against its reference bits: each kept when it
    gives the test rows the same bits at every position, else dropped."""
    kept, dropped = list(outcome.kept), list(outcome.dropped)
    for size in outcome.unchecked:
        same = block_bits(probes, variables, size) == (outcome.signature, outcome.agreement)
        (kept if same else dropped).append(size)
    return BlockCheck(tuple(kept), tuple(sorted(dropped)), outcome.signature,
                      agreement=outcome.agreement)


def group_probes(sampler, group: str) -> list[Probe]:
    """The functions of one of `GROUPS` that a `cvae.sampling.sampler.Sampler` runs through
    blocks, with their row widths (draws: noise; codes: a code; encode, classify: pixels)."""
    if group == "reading":
        return classify_probes(sampler)
    classes = len(sampler.classes)
    if group == "drawing":
        return [Probe(sampler.decode_fn, sampler.noise_dim, classes)]
    widths = ((sampler.prior_fn, sampler.noise_dim, False),
              (sampler.code_decode_fn, sampler.code_dim, False),
              (sampler.encode_fn, sampler.image_pixels, True))
    return [Probe(fn, width, classes, pixels) for fn, width, pixels in widths if fn is not None]


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
                  sampler.image_pixels, len(sampler.classes), pixels=True)]


def block_signature(probes: list[Probe], variables: dict, size: int) -> bytes | None:
    """`block_bits`' signature: the bits of the three test rows (what a fingerprint holds)."""
    bits = block_bits(probes, variables, size, inputs=size > 1)
    return None if bits is None else bits[0]


def block_bits(probes: list[Probe], variables: dict, size: int, *, inputs: bool = True
               ) -> tuple[bytes, bytes] | None:
    """Digests of the bits rows get in blocks of `size` rows: (signature, agreement), or None
    when some row gets other bits at another position. `inputs=False` leaves out the rows
    drawn like real inputs (an empty agreement): for a size compared with no other.

    The signature covers `_TEST_ROWS` uniform rows, each checked at every position of a block
    of its copies. The agreement covers those and `_INPUT_ROWS` rows drawn as the function's
    real inputs are (images in [0, 1], or N(0, I) noise and codes), run through blocks of
    `size` in turn until each has been in one: on a 2-core AMD EPYC (Zen 4) the default's
    decode gave 1 row in 12 of N(0, I) noise other bits in blocks of 256 rows than of 64 (its
    truncation's reduce, since summed in a fixed order: `cvae.model.prior.row_lengths`), and
    every uniform row, inside the radius, the same: three uniform rows alone kept those sizes."""
    signature, agreement = hashlib.sha256(), hashlib.sha256()
    for probe in probes:
        rows = np.random.default_rng(probe.width).random((_TEST_ROWS, probe.width), np.float32)
        labels = np.arange(_TEST_ROWS, dtype=np.int32) % probe.classes  # the model's labels
        alone = []  # each output's bits for the test rows
        for row in range(_TEST_ROWS):
            copies = _outputs(probe.fn, variables, rows=np.repeat(rows[row:row + 1], size, 0),
                              labels=np.full(size, labels[row], np.int32))
            for same in copies:
                if not np.array_equal(same, np.broadcast_to(same[:1], same.shape)):
                    return None
                signature.update(same[0].tobytes())
            alone.append([same[0] for same in copies])
        if not inputs:
            continue
        pool = np.concatenate([rows, _input_rows(probe)])
        # The test rows first, labelled as above (0, 1, 2 mod classes), then the input rows.
        pool_labels = np.arange(len(pool), dtype=np.int32) % probe.classes
        cycle = np.arange(-(-len(pool) // size) * size) % len(pool)
        blocks = [_outputs(probe.fn, variables, rows=pool[cycle[start:start + size]],
                           labels=pool_labels[cycle[start:start + size]])
                  for start in range(0, len(cycle), size)]
        for output, mixed in enumerate(np.concatenate(column) for column in zip(*blocks)):
            first = mixed[:len(pool)]  # every row once, in order
            among_copies = np.stack([bits[output] for bits in alone])
            if not (np.array_equal(mixed, first[cycle])
                    and np.array_equal(first[:_TEST_ROWS], among_copies)):
                return None
            agreement.update(first.tobytes())
    return signature.digest(), agreement.digest()


def _input_rows(probe: Probe) -> np.ndarray:
    """`_INPUT_ROWS` rows as the probe's function meets them: images or N(0, I)."""
    generator = np.random.default_rng((probe.width, 1))
    if probe.pixels:
        return generator.random((_INPUT_ROWS, probe.width), np.float32)
    return generator.standard_normal((_INPUT_ROWS, probe.width), np.float32)


def _outputs(fn: Callable, variables: dict, *, rows: np.ndarray, labels: np.ndarray
             ) -> list[np.ndarray]:
    """fn's outputs on one block, as unsigned integers (so bits compare, NaN and -0.0 too)."""
    out = fn(variables, rows, labels)
    return [np.asarray(value).view(np.uint32) for value in (out if isinstance(out, tuple)
                                                             else (out,))]
