"""The one decode sampler, shared by `cvae sample`, the per-epoch grids and the service.

A request is (digit or all digits, n, seed, temperature); its latents depend only on those
values (cvae/sampling/latents.py). Decoding runs on padded blocks of a few fixed sizes that
share one kernel (see `DECODE_BLOCKS`), so a row's pixels are the same whatever else is decoded
alongside: a seeded request gives the same pixels whether it was decoded alone or batched with
others. It also maps draws to codes, decodes codes and encodes (q(z|x,y) of given images, for
walks and style transfer) through blocks of their own, with the same guarantee, checked when
first needed. Noise is `Sampler.noise_dim` wide, codes `Sampler.code_dim`: the ladder's every
layer and top layer.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable

import numpy as np

from cvae.model import prior as prior_lib
from cvae.sampling.blocks import (CHECKS, DECODE_BLOCKS, GROUPS, ROW_BY_ROW, block_check,
                                  check_remaining, group_probes, plan_blocks)
from cvae.config.sections import Config, ConfigError
from cvae.data.class_names import label_index
from cvae.data.pixels import to_unit
from cvae.sampling.functions import sampler_functions
from cvae.sampling.grid import grid_columns, make_grid, png_bytes
from cvae.sampling.latents import LatentRequest, batch_latents
from cvae.limits import DEFAULT_PAD, DEFAULT_SCALE, DEFAULT_TEMPERATURE
from cvae.model.registry import code_dim, create_model, noise_dim
from cvae.model.transport import ClassTransport, class_transport
from cvae.data.specs import spec_of


# Each group's block sizes, as a `Sampler` attribute; the groups checked after drawing.
SIZES = {"drawing": "block_sizes", "codes": "code_block_sizes", "reading": "classify_block_sizes"}
LATER_GROUPS = GROUPS[1:]


@dataclasses.dataclass
class Sampler:
    """Decodes latents in padded blocks of a few fixed sizes; holds one checkpoint's weights."""

    config: Config
    variables: dict
    decode_fn: Callable
    step: int = 0
    block_sizes: tuple[int, ...] = DECODE_BLOCKS
    encode_fn: Callable | None = None  # `create_encode_fn`'s; None: this sampler only decodes
    # Decodes codes as they are. `decode_fn` decodes prior draws: the same program while the
    # prior is N(0, I) (None: use decode_fn); a prior that maps noise to z needs this one apart.
    code_decode_fn: Callable | None = None
    prior_fn: Callable | None = None  # `create_prior_fn`'s; None: codes are the noise itself
    classify_fn: Callable | None = None  # `create_classify_fn`'s; None: reads no digits
    dropped_blocks: tuple[int, ...] = ()  # what `check_blocks` found to disagree here
    # The codes' (prior mapping, code decode, encode) and `classify`'s, each checked on its own.
    code_block_sizes: tuple[int, ...] = DECODE_BLOCKS
    dropped_code_blocks: tuple[int, ...] = ()
    classify_block_sizes: tuple[int, ...] = DECODE_BLOCKS
    dropped_classify_blocks: tuple[int, ...] = ()
    # `check_blocks`': the bits this machine's kernels give `decode` (what a served picture's
    # fingerprint covers; the other groups': `signature`), and all the checked groups' together.
    drawing_signature: bytes = b""
    kernel_signature: bytes = b""
    # (the mixture's `means` array, its transport): made on first use from `variables`, which
    # callers may set after creating the sampler.
    _transport: tuple | None = dataclasses.field(default=None, init=False, repr=False)
    # The last `check_blocks` outcome of each of `GROUPS`: what `check_remaining_blocks`
    # extends; codes and reading are None until checked (a server and `cvae sample` leave them).
    _checks: dict | None = dataclasses.field(default=None, init=False, repr=False)
    _check_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock,
                                                    init=False, repr=False)

    def class_transport(self) -> ClassTransport | None:
        """How label swaps carry a code between classes (cvae.model.transport); None: as it is."""
        if not self.config.prior.component.draws_from_mixture:
            return None
        means = self.variables[prior_lib.COLLECTION][prior_lib.VARIABLE]["means"]
        if self._transport is None or self._transport[0] is not means:
            self._transport = (means, class_transport(self.config, self.variables))
        return self._transport[1]

    def swap(self, z: np.ndarray, source, target: np.ndarray) -> np.ndarray:
        """Codes of class(es) `source` -> codes to decode with labels `target` (the identity
        without a transport, and from a class to itself)."""
        transport = self.class_transport()
        if transport is None:
            return z
        return transport.apply(z, np.broadcast_to(source, np.shape(target)), target)

    @property
    def code_dim(self) -> int:
        """The width of a code (`encode`'s, `decode_codes`'): the ladder's top layer."""
        return code_dim(self.config)

    @property
    def noise_dim(self) -> int:
        """The width of a prior draw (`decode`'s, `to_codes`'): every ladder layer, top first."""
        return noise_dim(self.config)

    @property
    def has_classifier(self) -> bool:
        """Whether `classify` is a `--labels N` model's own q(y|x), not Bayes' rule."""
        return self.classify_fn is not None and create_model(self.config).has_classifier

    @property
    def image_pixels(self) -> int:
        """The width of `encode_fn`'s rows: the dataset spec's values an image."""
        return spec_of(self.config.data.dataset).pixels

    @property
    def classes(self) -> tuple[int, ...]:
        """The labels this model draws, 0..num_classes - 1 of its dataset's spec."""
        return tuple(range(spec_of(self.config.data.dataset).num_classes))

    @property
    def class_names(self) -> tuple[str, ...]:
        """The names of `classes`, in their order: the dataset spec's."""
        return spec_of(self.config.data.dataset).class_names

    def class_index(self, label: str | int) -> int:
        """Class `label`, by name or index -> its index; else UnknownLabel listing the names."""
        return label_index(self.class_names, label)

    def decode(self, z: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """Prior draws f32[B, noise_dim], i32[B] -> f32[B, h, w], in `plan_blocks`' blocks."""
        return self._decode_blocks(self.decode_fn, z, labels, sizes=self.block_sizes)

    def decode_codes(self, z: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """Codes (posterior latents) f32[B, L], i32[B] -> f32[B, h, w], in the codes' blocks."""
        self._check_group("codes")
        return self._decode_blocks(self.code_decode_fn or self.decode_fn, z, labels,
                                   sizes=self.code_block_sizes)

    def to_codes(self, noise: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """Prior draws f32[B, noise_dim] -> the codes `decode` decodes them as (the prior's
        mapping; the ladder's top layer), in the codes' blocks; else the draws themselves."""
        if self.prior_fn is None:
            return noise
        self._check_group("codes")
        codes = self._decode_blocks(self.prior_fn, noise, labels, sizes=self.code_block_sizes)
        return codes.reshape(len(noise), self.code_dim)

    def _in_blocks(self, fn: Callable, *inputs: np.ndarray,
                   sizes: tuple[int, ...] | None = None) -> list[np.ndarray] | None:
        """fn(variables, *inputs) over the blocks `plan_blocks` chooses from `sizes` (default:
        `block_sizes`), every input padded with zero rows to the block's size: its outputs (one
        array, or each of a tuple), the padding cut off and the blocks joined; None when there
        are no rows."""
        parts, start = [], 0
        for size in plan_blocks(len(inputs[0]), sizes or self.block_sizes):
            blocks = [x[start:start + size] for x in inputs]
            rows = len(blocks[0])
            out = fn(self.variables, *(_padded(block, size) for block in blocks))
            parts.append([np.asarray(value)[:rows]
                          for value in (out if isinstance(out, tuple) else (out,))])
            start += size
        return [np.concatenate(column) for column in zip(*parts)] if parts else None

    def _decode_blocks(self, decode_fn: Callable, z: np.ndarray, labels: np.ndarray, *,
                       sizes: tuple[int, ...]):
        out = self._in_blocks(decode_fn, z, labels, sizes=sizes)
        return out[0] if out else np.zeros((0, *spec_of(self.config.data.dataset).stored_shape),
                                           np.float32)

    def encode(self, images: np.ndarray, labels: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """uint8[B, h, w], i32[B] -> `create_encode_fn`'s (mean, logvar, neg_elbo), through
        the codes' blocks, so a row's values do not depend on its neighbours."""
        self._check_group("codes")
        x = to_unit(np.asarray(images).reshape(len(images), self.image_pixels))
        out = self._in_blocks(self.encode_fn, x, np.asarray(labels, np.int32),
                              sizes=self.code_block_sizes)
        if out is None:
            latent = np.zeros((0, self.code_dim), np.float32)
            return latent, latent, np.zeros(0, np.float32)
        return tuple(out)

    def classify(self, images: np.ndarray) -> np.ndarray:
        """uint8[B, h, w] -> p(y|x), f32[B, classes], through blocks of `classify_block_sizes` (a
        row's probabilities do not depend on its neighbours): q(y|x) of a few-label model, Bayes'
        rule for a model trained with every label (`create_classify_fn`)."""
        if self.classify_fn is None:
            raise ValueError("this sampler reads no digits (created without a classify_fn)")
        self._check_group("reading")
        x = to_unit(np.asarray(images).reshape(len(images), self.image_pixels))
        out = self._in_blocks(self.classify_fn, x, sizes=self.classify_block_sizes)
        return out[0] if out else np.zeros((0, len(self.classes)), np.float32)

    def check_blocks(self, check: str = "all") -> tuple[int, ...]:
        """Keep only the block sizes in which every row position gives a row the same bits
        (`block_check`, whose module says why this is checked where the sampler runs), for each
        of `GROUPS` on its own: the smallest size that agrees sets the bits, larger sizes that
        give the same bits are kept, and with none the group runs one row per call. Compiles
        what it checks (so it doubles as the warm-up); returns the drawing sizes dropped.

        check (`CHECKS`): `all` sizes of every group; or the `first` size kept of drawing's
        (`decode`, all that `/sample` runs), leaving its larger sizes and the other groups to
        `check_remaining_blocks` (a server answers once one size is compiled; `cvae sample`).
        Every size added later gives the bits of the first. Codes and reading are checked by
        the first call that needs them, when still unchecked.
        """
        if check not in CHECKS:
            raise ValueError(f"check={check!r}: one of {', '.join(CHECKS)}")
        drawing = block_check(group_probes(self, "drawing"), self.variables, self.block_sizes,
                              first_only=check != "all")
        self._use_checks({"drawing": drawing, "codes": None, "reading": None})
        if check == "all":
            for group in LATER_GROUPS:
                self._check_group(group, first_only=False)
        return drawing.dropped

    def check_remaining_blocks(self) -> tuple[int, ...]:
        """Check what `check_blocks("first")` left: codes and reading, then the larger sizes of
        every group, adding those that keep its first size's bits; returns the drawing sizes
        dropped. The kept sizes grow in place (one assignment, so a call running meanwhile
        plans with the old or the new ones)."""
        for group in LATER_GROUPS:
            self._check_group(group)
        with self._check_lock:
            checks = dict(self._checks)
            for group, outcome in checks.items():
                if outcome is not None and outcome.unchecked:
                    checks[group] = check_remaining(group_probes(self, group), self.variables,
                                                    outcome)
            self._use_checks(checks)
        return self.dropped_blocks

    def signature(self, *groups: str) -> bytes:
        """The bits this machine's kernels give `groups`' test rows (what an ETag of their
        output covers), checking any group not checked yet (0.1 to 0.4 s, once): empty for a
        sampler whose blocks were never checked."""
        for group in groups:
            self._check_group(group)
        checks = self._checks or {}
        return b"".join(checks[group].signature for group in groups
                        if checks.get(group) is not None)

    def checked(self, *groups: str) -> bool:
        """Whether `signature(*groups)` is ready without checking anything."""
        return not any(self._unchecked(group) for group in groups)

    def _unchecked(self, group: str) -> bool:
        """Whether `group` has functions whose blocks `check_blocks` left for later."""
        return (self._checks is not None and self._checks[group] is None
                and bool(group_probes(self, group)))

    def _check_group(self, group: str, *, first_only: bool = True) -> None:
        """Check `group`'s block sizes (the first kept, or all) unless done: once, whichever
        thread asks first (a request, or a server's background checks); the others wait."""
        if not self._unchecked(group):
            return  # never checked (its sizes used as given), checked, or nothing to check
        with self._check_lock:
            if self._checks[group] is None:
                self._use_checks({**self._checks, group: block_check(
                    group_probes(self, group), self.variables, getattr(self, SIZES[group]),
                    first_only=first_only)})

    @property
    def blocks_unchecked(self) -> tuple[int, ...]:
        """The sizes of any group that `check_blocks("first")` left for
        `check_remaining_blocks` (not run with until then); all of a group's while it is
        unchecked."""
        if self._checks is None:
            return ()
        pending = set()
        for group, outcome in self._checks.items():
            if outcome is not None:
                pending.update(outcome.unchecked)
            elif self._unchecked(group):
                pending.update(getattr(self, SIZES[group]))
        return tuple(sorted(pending))

    def _use_checks(self, checks: dict) -> None:
        drawing, codes, reading = (checks[group] for group in GROUPS)
        self.block_sizes, self.dropped_blocks = drawing.kept, drawing.dropped
        self.drawing_signature = drawing.signature
        if codes is not None:
            self.code_block_sizes, self.dropped_code_blocks = codes.kept, codes.dropped
        if reading is not None:
            self.classify_block_sizes = reading.kept
            self.dropped_classify_blocks = reading.dropped
        self.kernel_signature = b"".join(outcome.signature for outcome in (drawing, codes, reading)
                                         if outcome is not None)
        self._checks = checks

    def warm_up(self) -> None:
        """Compile what a first request runs besides the checked decode blocks: the latent
        draw of up to 16 rows a class (one program: `batch_latents`) and the grid."""
        self.sample_png(None, 16, 0)

    def sample_images(self, digit: int | None, n: int, seed: int,
                      *, temperature: float = DEFAULT_TEMPERATURE) -> np.ndarray:
        if digit not in (None, *self.classes):  # `cvae sample --digit` bounds it by all datasets
            raise ConfigError(f"digit {digit}: this model's classes are 0..{self.classes[-1]}")
        digits = self.classes if digit is None else (digit,)
        # `request_latents`' values, through the service's program (compiled once, or cached)
        ((z, labels),) = batch_latents([LatentRequest(seed, digits, n, temperature)],
                                       self.noise_dim)
        return self.decode(z, labels)

    def sample_png(self, digit: int | None, n: int, seed: int,
                   *, temperature: float = DEFAULT_TEMPERATURE, cols: int | None = None,
                   scale: int = DEFAULT_SCALE, pad: int = DEFAULT_PAD) -> bytes:
        images = self.sample_images(digit, n, seed, temperature=temperature)
        return png_bytes(make_grid(images, grid_columns(digit, n, cols), pad=pad, scale=scale,
                                   image_shape=spec_of(self.config.data.dataset).stored_shape))


def load_sampler(checkpoint_dir, step=None, block_rows: int | None = None, *,
                 truncation: float | None = None, check: str = "all") -> Sampler:
    """A sampler for the latest (or chosen: `cvae.model.store.StepChoice`) checkpoint, using EMA
    weights when the run kept them,
    its block sizes verified on this machine (`Sampler.check_blocks`, which also compiles them):
    what `cvae sample`, the service and the tests use. `truncation`: `Config.drawn_at`;
    `check`: which sizes and functions `Sampler.check_blocks` checks now."""
    from cvae.model.store import load_trained_model  # Orbax: imported here, when first needed

    trained = load_trained_model(checkpoint_dir, step)
    config = trained.config.drawn_at(truncation)
    sampler = create_sampler(create_model(config), config, trained.variables,
                             step=trained.step, block_rows=block_rows)
    sampler.check_blocks(check)
    return sampler


def create_sampler(model, config: Config, variables: dict, *, step: int = 0,
                   block_rows: int | None = None) -> Sampler:
    """`block_rows`: decode in blocks of exactly this many rows (default: `DECODE_BLOCKS`).
    Bayes' rule reads one picture a call (a request uploads one; each is already every
    label's K draws, 160 decoder rows for the default), so a reading never pads to a block
    of 64 and never depends on a neighbour; q(y|x), cheap and read in batches, in every size."""
    blocks = DECODE_BLOCKS if block_rows is None else (block_rows,)
    reading_blocks = blocks if model.has_classifier else ROW_BY_ROW
    decode_fn, code_decode_fn, prior_fn, encode_fn, classify_fn = sampler_functions(model, config)
    return Sampler(config, variables, decode_fn, step, blocks, encode_fn=encode_fn,
                   code_decode_fn=code_decode_fn, prior_fn=prior_fn, classify_fn=classify_fn,
                   classify_block_sizes=reading_blocks)


def _padded(block: np.ndarray, size: int) -> np.ndarray:
    """`block` with zero rows added up to `size` rows (what `np.pad` gives, without its
    per-call Python: the service pads every batch it decodes)."""
    if len(block) == size:
        return block
    out = np.zeros((size, *block.shape[1:]), block.dtype)
    out[:len(block)] = block
    return out
