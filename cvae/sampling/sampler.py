"""The one decode sampler, shared by `cvae sample`, the per-epoch grids and the service.

A request is (digit or all digits, n, seed, temperature). Its latents depend only on those
values: z = temperature * N(0, I) drawn from key(seed) folded with the digit. Decoding runs on
padded blocks of a few fixed sizes that share one kernel (see `DECODE_BLOCKS`), so a row's
pixels are the same whatever else is decoded alongside: a seeded request gives the same pixels
whether it was decoded alone or batched with others. It also encodes (q(z|x,y) of given images,
for style transfer) through the same blocks, with the same guarantee. Noise is
`Sampler.noise_dim` wide, codes `Sampler.code_dim`: the ladder's every layer and top layer.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cvae.model import prior as prior_lib
from cvae.sampling.blocks import (CHECKS, DECODE_BLOCKS, ROW_BY_ROW, BlockCheck, block_check,
                                  check_remaining, classify_probes, plan_blocks, sampler_probes)
from cvae.config.sections import Config, ConfigError
from cvae.data.class_names import label_index
from cvae.data.pixels import to_unit
from cvae.sampling.functions import sampler_functions
from cvae.sampling.grid import grid_columns, make_grid, png_bytes
from cvae.limits import DEFAULT_PAD, DEFAULT_SCALE, DEFAULT_TEMPERATURE
from cvae.model.registry import code_dim, create_model, noise_dim
from cvae.model.transport import ClassTransport, class_transport
from cvae.data.specs import spec_of


def draw_latents(seed: int, digit: int, n: int, *, noise_width: int,
                 temperature: float) -> np.ndarray:
    """z ~ N(0, temperature^2 I): float32[n, noise_width], a function of its arguments only."""
    key = jax.random.fold_in(jax.random.key(seed), digit)
    z = jax.random.normal(key, (n, noise_width), jnp.float32) * jnp.float32(temperature)
    return np.asarray(z)


def request_latents(seed: int, digits: tuple[int, ...], n: int, *, noise_width: int,
                    temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """Latents and labels for n samples of each digit, digit-major: (f32[D*n, L], i32[D*n])."""
    z = np.concatenate([draw_latents(seed, d, n, noise_width=noise_width,
                                     temperature=temperature) for d in digits])
    labels = np.repeat(np.asarray(digits, np.int32), n)
    return z, labels


class LatentRequest(NamedTuple):
    """The arguments of `request_latents` for one request (noise_width comes from the model)."""

    seed: int
    digits: tuple[int, ...]
    n: int
    temperature: float

    @property
    def rows(self) -> int:
        """Images decoded for it."""
        return len(self.digits) * self.n


class Codes(NamedTuple):
    """Rows whose z are codes (latents), to decode as they are (`Sampler.decode_codes`), not
    prior noise: a transfer's posterior latents, or a latent walk's points."""

    z: np.ndarray  # f32[rows, L]
    labels: np.ndarray  # i32[rows]
    label: int | None = None  # a transfer's: the label its image was encoded with


def _bucket(size: int, minimum: int) -> int:
    return max(minimum, 1 << (size - 1).bit_length())


# (seed, digit) pairs drawn per device call: one program per row count, whatever the batch
# (a program per pair count cost a start-up compile each: 2 to 3 s on a 2-core CPU).
PAIRS_PER_CALL = 64


@functools.partial(jax.jit, static_argnames=("rows", "noise_width"))
def _unit_normals(seeds, digits, rows: int, noise_width: int):
    """u32[K], i32[K] -> f32[K, rows, L]: N(0, I) drawn from key(seed) folded with the digit.

    Drawn as one flat vector of rows * L values and reshaped: the same bits as a (rows, L)
    draw (JAX draws a shape's values flat), and XLA:CPU compiles it in a third of the time
    (0.8 s against 2.9 s for 16 rows of 16 on a 2-core CPU)."""
    def one(seed, digit):
        key = jax.random.fold_in(jax.random.key(seed), digit)
        flat = jax.random.normal(key, (rows * noise_width,), jnp.float32)
        return flat.reshape(rows, noise_width)
    return jax.vmap(one)(seeds, digits)


def batch_latents(requests: list[LatentRequest], noise_width: int
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """`request_latents` for many requests in few device calls; same values.

    Threefry draws are counter based, so the first n rows of an (N, L) draw equal an (n, L)
    draw: each (seed, digit) pair draws a power-of-two number of rows, and the pairs go
    `PAIRS_PER_CALL` a call (the last call padded), so one program per row count is ever
    compiled. The temperature is applied in NumPy, one float32 multiply, exactly as
    `draw_latents` does. JAX uses the low 32 bits of a Python int seed (without
    jax_enable_x64), so seeds are passed as seed mod 2**32.
    """
    results: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(requests)
    classes: dict[int, list[int]] = {}
    for index, request in enumerate(requests):
        classes.setdefault(_bucket(request.n, 16), []).append(index)
    for rows, members in classes.items():
        pairs = [(requests[i].seed % 2**32, d) for i in members for d in requests[i].digits]
        size = -(-len(pairs) // PAIRS_PER_CALL) * PAIRS_PER_CALL
        seeds = np.zeros(size, np.uint32)
        digits = np.zeros(size, np.int32)
        seeds[:len(pairs)], digits[:len(pairs)] = zip(*pairs)
        normals = np.concatenate([
            np.asarray(_unit_normals(seeds[start:start + PAIRS_PER_CALL],
                                     digits[start:start + PAIRS_PER_CALL], rows=rows,
                                     noise_width=noise_width))
            for start in range(0, size, PAIRS_PER_CALL)])
        start = 0
        for i in members:
            seed, request_digits, n, temperature = requests[i]
            block = normals[start:start + len(request_digits), :n]
            start += len(request_digits)
            z = block.reshape(-1, noise_width) * np.float32(temperature)
            results[i] = (z, np.repeat(np.asarray(request_digits, np.int32), n))
    return results


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
    classify_block_sizes: tuple[int, ...] = DECODE_BLOCKS  # `classify`'s, checked on their own
    dropped_classify_blocks: tuple[int, ...] = ()
    # `check_blocks`': the bits this machine's kernels give the drawing functions (what a served
    # picture's fingerprint covers), and those with reading's (`classify`) once it is checked.
    drawing_signature: bytes = b""
    kernel_signature: bytes = b""
    # (the mixture's `means` array, its transport): made on first use from `variables`, which
    # callers may set after creating the sampler.
    _transport: tuple | None = dataclasses.field(default=None, init=False, repr=False)
    # The last `check_blocks` outcome (drawing, reading): what `check_remaining_blocks` extends;
    # reading is None until checked (a server and `cvae sample` leave it for later).
    _checks: tuple | None = dataclasses.field(default=None, init=False, repr=False)
    _reading_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock,
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
        return self._decode_blocks(self.decode_fn, z, labels)

    def decode_codes(self, z: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """Codes (posterior latents) f32[B, L], i32[B] -> f32[B, h, w], the same blocks."""
        return self._decode_blocks(self.code_decode_fn or self.decode_fn, z, labels)

    def to_codes(self, noise: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """Prior draws f32[B, noise_dim] -> the codes `decode` decodes them as (the prior's
        mapping; the ladder's top layer), through the same blocks; else the draws themselves."""
        if self.prior_fn is None:
            return noise
        codes = self._decode_blocks(self.prior_fn, noise, labels)
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
            out = fn(self.variables, *(np.pad(block, [(0, size - rows)] + [(0, 0)] *
                                              (block.ndim - 1)) for block in blocks))
            parts.append([np.asarray(value)[:rows]
                          for value in (out if isinstance(out, tuple) else (out,))])
            start += size
        return [np.concatenate(column) for column in zip(*parts)] if parts else None

    def _decode_blocks(self, decode_fn: Callable, z: np.ndarray, labels: np.ndarray):
        out = self._in_blocks(decode_fn, z, labels)
        return out[0] if out else np.zeros((0, *spec_of(self.config.data.dataset).stored_shape),
                                           np.float32)

    def encode(self, images: np.ndarray, labels: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """uint8[B, h, w], i32[B] -> `create_encode_fn`'s (mean, logvar, neg_elbo), through
        the same blocks as `decode`, so a row's values do not depend on its neighbours."""
        x = to_unit(np.asarray(images).reshape(len(images), self.image_pixels))
        out = self._in_blocks(self.encode_fn, x, np.asarray(labels, np.int32))
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
        self._check_reading()
        x = to_unit(np.asarray(images).reshape(len(images), self.image_pixels))
        out = self._in_blocks(self.classify_fn, x, sizes=self.classify_block_sizes)
        return out[0] if out else np.zeros((0, len(self.classes)), np.float32)

    def check_blocks(self, check: str = "all") -> tuple[int, ...]:
        """Keep only the block sizes in which every row position gives a row the same bits
        (`block_check`, whose module says why this is checked where the sampler runs): the
        smallest size that agrees sets the bits, larger sizes that give the same bits are kept,
        and with none the sampler decodes one row per call. `classify` is checked over its own
        sizes, so a size only reading cannot keep stays for drawing. Compiles what it checks
        (so it doubles as the warm-up); returns the drawing sizes dropped.

        check (`CHECKS`): `all` sizes and functions; the `first` size kept of the drawing
        functions (decode, the prior's mapping, code decode, encode), leaving the larger sizes
        and `classify` to `check_remaining_blocks` (a server answers once one size is compiled);
        or only `drawing`: the first size of `decode` alone (`cvae sample`). Every size added
        later gives the bits of the first. `classify` checks its reading itself when it is
        first called unchecked.
        """
        if check not in CHECKS:
            raise ValueError(f"check={check!r}: one of {', '.join(CHECKS)}")
        probes = sampler_probes(self)
        outcome = block_check(probes[:1] if check == "drawing" else probes, self.variables,
                              self.block_sizes, first_only=check != "all")
        self._use_checks(outcome, None)
        if check == "all":
            self._check_reading(first_only=False)
        return outcome.dropped

    def check_remaining_blocks(self) -> tuple[int, ...]:
        """Check what `check_blocks("first")` left: reading (`classify`), then the drawing
        sizes, adding those that keep the first size's bits; returns the drawing sizes dropped.
        The kept sizes grow in place (one assignment, so a decode running meanwhile plans with
        the old or the new ones)."""
        self._check_reading(first_only=False)  # from here on no other thread sets `_checks`
        drawing, reading = self._checks
        if reading is not None and reading.unchecked:
            reading = check_remaining(classify_probes(self), self.variables, reading)
        outcome = check_remaining(sampler_probes(self), self.variables, drawing)
        self._use_checks(outcome, reading)
        return outcome.dropped

    def _check_reading(self, first_only: bool = True) -> None:
        """Check `classify`'s block sizes (the first kept, or all) unless done: once, whichever
        thread asks first (a request, or a server's background checks); the others wait."""
        if self._checks is None or self._checks[1] is not None or not classify_probes(self):
            return  # never checked (its sizes used as given), checked, or it reads no digits
        with self._reading_lock:
            drawing, reading = self._checks
            if reading is None:
                self._use_checks(drawing, block_check(
                    classify_probes(self), self.variables, self.classify_block_sizes,
                    first_only=first_only))

    @property
    def blocks_unchecked(self) -> tuple[int, ...]:
        """The sizes, drawing's or reading's, that `check_blocks("first")` left for
        `check_remaining_blocks` (not decoded with until then); all of reading's while it is
        unchecked."""
        if self._checks is None:
            return ()
        drawing, reading = self._checks
        pending = reading.unchecked if reading is not None else self.classify_block_sizes
        return tuple(sorted({*drawing.unchecked, *(pending if classify_probes(self) else ())}))

    def _use_checks(self, drawing: BlockCheck, reading: BlockCheck | None) -> None:
        self.block_sizes, self.dropped_blocks = drawing.kept, drawing.dropped
        self.drawing_signature = self.kernel_signature = drawing.signature
        if reading is not None:
            self.classify_block_sizes = reading.kept
            self.dropped_classify_blocks = reading.dropped
            self.kernel_signature = drawing.signature + reading.signature
        self._checks = (drawing, reading)

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
