"""A convolutional hierarchical VAE in the style of VDVAE (Child 2021) and NVAE (Vahdat and
Kautz 2020), class-conditional, shaped for the CPU as well as the GPU.

Bottom up, the encoder runs residual cells at each resolution (the image's, then halved while
both sides stay even, `len(depths)` resolutions) and keeps each resolution's activation. Top
down, the decoder starts from a learnt map at the coarsest resolution and runs, at each
resolution from the coarsest, `depths[r]` blocks; each block but those at the finest
resolution draws a latent group of `latent_channels` channels per position: its prior from the
decoder's state, its posterior from that state and the encoder's activation at the same
resolution; the group is added back into the state and a residual cell follows. The first
group, at the coarsest resolution, is the code: its posterior reads the encoder alone, and its
prior is the family's shared prior over codes (`Family.log_prior`), so the fitted and learnt
priors, transfer and walks work on it. Every cell adds a projection of the class to its input.

A cell is VDVAE's bottleneck: 1x1 to a quarter of the width, two 3x3, 1x1 back, added to its
input. The 3x3 convolutions (`cvae.model.convolution.Conv3x3`) run XLA's convolution forward
and for the input's gradient, and the kernel's gradient as shifted slices and one matrix
product: inside the training loop XLA:CPU runs its own convolutions' gradients as plain loops.

Noise and latent vectors are the groups flattened and concatenated in top-down order, the
code's group first, like the ladder's.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from cvae.config.settings import setting
from cvae.model import densities, objectives
from cvae.model.convolution import Conv3x3
from cvae.model.interface import Family, Terms
from cvae.model.layers import soft_clamp

LOGVAR_BOUND = 8.0
# The layers' parameter names in a cell and in the classifier, in order: those flax gave them
# when each 3x3 convolution was a Dense over its windows, whose parameters `Conv3x3` keeps, so
# that checkpoints written then still load.
LAYER_NAMES = tuple(f"Dense_{i}" for i in range(5))


@dataclasses.dataclass(frozen=True)
class Options:
    """The hierarchical family's options: its width, depth and latent groups."""

    width: int = setting(32, "Channels of the residual stream at every resolution.", low=8)
    depths: tuple[int, ...] = setting(
        (1, 2, 2), "Residual cells at each resolution, the finest first (its length is the "
                   "number of resolutions: the image's, then halved).", low=1)
    latent_channels: int = setting(
        4, "Channels of each latent group (one group per decoder block above the finest "
           "resolution).", low=1)


def resolutions(options: Options, height: int, width: int) -> list[tuple[int, int]]:
    """(height, width) of each resolution, the finest first; ConfigError-free: the sides halve
    only while both stay even, so an odd side ends the list early."""
    sides = [(height, width)]
    while len(sides) < len(options.depths) and sides[-1][0] % 2 == 0 and sides[-1][1] % 2 == 0:
        sides.append((sides[-1][0] // 2, sides[-1][1] // 2))
    return sides


def group_shapes(options: Options, height: int, width: int) -> list[tuple[int, int, int]]:
    """Each latent group's (h, w, channels), top-down: the coarsest resolution's first."""
    sides = resolutions(options, height, width)
    shapes = []
    for level in reversed(range(1, len(sides))):
        shapes += [(*sides[level], options.latent_channels)] * options.depths[level]
    return shapes


class Cell(nn.Module):
    """VDVAE's residual bottleneck with the class added to its input."""

    width: int

    @nn.compact
    def __call__(self, h: jax.Array, onehot: jax.Array) -> jax.Array:
        mid = max(self.width // 4, 8)
        names = iter(LAYER_NAMES)
        x = h + nn.Dense(self.width, use_bias=False, name=next(names))(onehot)[:, None, None, :]
        x = nn.Dense(mid, name=next(names))(nn.gelu(x))
        x = Conv3x3(mid, name=next(names))(nn.gelu(x))
        x = Conv3x3(mid, name=next(names))(nn.gelu(x))
        return h + nn.Dense(self.width, kernel_init=nn.initializers.zeros,
                            name=next(names))(nn.gelu(x))


class ConvClassifier(nn.Module):
    """q(y|x) for the hierarchical family: two 3x3 convolutions at the image's resolution and
    at half of it, averaged over the positions, then the class logits."""

    width: int
    classes: int
    image_shape: tuple[int, int, int]

    @nn.compact
    def __call__(self, images: jax.Array, *, train: bool = False) -> jax.Array:
        names = iter(LAYER_NAMES)
        h = nn.gelu(Conv3x3(self.width, name=next(names))(images.reshape(-1, *self.image_shape)))
        h = nn.avg_pool(h, (2, 2), strides=(2, 2), padding="SAME")
        h = nn.gelu(Conv3x3(self.width, name=next(names))(h))
        return nn.Dense(self.classes, name=next(names))(h.mean(axis=(1, 2)))


class Group(NamedTuple):
    """One latent group of a pass: its draw and its posterior and prior, each f32[N, h, w, c]
    (the code's prior is the family's and not stored here: zeros)."""

    z: jax.Array
    q_mean: jax.Array
    q_logvar: jax.Array
    p_mean: jax.Array
    p_logvar: jax.Array


class Hierarchical(Family):
    """A convolutional hierarchical VAE (VDVAE-style), the class in every cell."""

    Options = Options
    EXPORT_MODULES = {"sample": ("start", "decoder_cells", "priors", "injections", "head"),
                      "encode": ("stem", "encoder_cells", "code_posterior", "start",
                                 "decoder_cells", "priors", "injections", "head"),
                      "classify": ("classifier",)}
    PARAM_GROUPS = {"encoder": ("stem", "encoder_cells", "code_posterior", "posteriors"),
                    "decoder": ("start", "decoder_cells", "priors", "injections", "head")}

    def setup(self):
        options, data = self.options, self.data
        self.sides = resolutions(options, data.height, data.width)
        self.shapes = group_shapes(options, data.height, data.width)
        width, groups = options.width, len(self.shapes)
        self.stem = nn.Dense(width)
        self.encoder_cells = [Cell(width) for level in range(len(self.sides))
                              for _ in range(options.depths[level])]
        self.code_posterior = nn.Dense(2 * options.latent_channels)
        self.start = self.param("start", nn.initializers.normal(0.02),
                                (*self.sides[-1], width))
        self.decoder_cells = [Cell(width) for level in reversed(range(len(self.sides)))
                              for _ in range(options.depths[level])]
        self.priors = [nn.Dense(2 * options.latent_channels + width,
                                kernel_init=nn.initializers.zeros) for _ in range(groups - 1)]
        self.posteriors = [nn.Dense(2 * options.latent_channels) for _ in range(groups - 1)]
        self.injections = [nn.Dense(width) for _ in range(groups)]
        self.head = nn.Dense(densities.output_channels(self.likelihood, data.channels))
        self.setup_prior(math.prod(self.shapes[0]), logvar_bound=LOGVAR_BOUND)

    def make_classifier(self) -> nn.Module:
        return ConvClassifier(self.options.width, self.data.num_classes,
                              self.data.image_shape)

    @staticmethod
    def widths(options: Options, data) -> tuple[int, int]:
        """(every group's values, the code group's), for images of `data`'s sides."""
        shapes = group_shapes(options, data.height, data.width)
        return sum(math.prod(shape) for shape in shapes), math.prod(shapes[0])

    # -- the two passes --------------------------------------------------------------------

    def _encode_maps(self, images: jax.Array, onehot: jax.Array) -> list[jax.Array]:
        """Images f32[B, P] -> the encoder's activation at each resolution, finest first."""
        h = self.stem(images.reshape(-1, *self.data.image_shape))
        maps, cells = [], iter(self.encoder_cells)
        for level in range(len(self.sides)):
            if level:
                h = nn.avg_pool(h, (2, 2), strides=(2, 2))
            for _ in range(self.options.depths[level]):
                h = next(cells)(h, onehot)
            maps.append(h)
        return maps

    def _code_posterior(self, coarsest: jax.Array):
        mean, logvar = jnp.split(self.code_posterior(coarsest), 2, axis=-1)
        return mean, soft_clamp(logvar, LOGVAR_BOUND)

    def _top_down(self, onehot: jax.Array, z_of: Callable, maps: list | None):
        """The decoder: z_of(index, q or None, p or None) gives each group's draw (q is None
        without the encoder's maps). -> (decoder outputs f32[N, M * H * W], the groups)."""
        depths = self.options.depths
        n = onehot.shape[0]
        h = jnp.broadcast_to(self.start, (n, *self.start.shape))
        groups, index, cells = [], 0, iter(self.decoder_cells)
        for level in reversed(range(len(self.sides))):
            if level < len(self.sides) - 1:
                h = jnp.repeat(jnp.repeat(h, 2, axis=1), 2, axis=2)
            for _ in range(depths[level]):
                if level > 0:
                    h, group = self._latent(index, h, onehot, z_of=z_of, maps=maps,
                                            level=level)
                    groups.append(group)
                    index += 1
                h = next(cells)(h, onehot)
        outputs = self.head(nn.gelu(h))
        return _flat_outputs(outputs, self.likelihood, self.data.channels), groups

    def _latent(self, index: int, h, onehot, *, z_of: Callable, maps, level: int):
        """One block's latent group: its prior, posterior and draw, added into the state."""
        zeros = jnp.zeros(h.shape[:-1] + (self.options.latent_channels,))
        if index == 0:
            q = self._code_posterior(maps[level]) if maps is not None else None
            p = (zeros, zeros)
        else:
            split = jnp.split(self.priors[index - 1](h), [zeros.shape[-1],
                                                          2 * zeros.shape[-1]], axis=-1)
            p = (split[0], soft_clamp(split[1], LOGVAR_BOUND))
            h = h + split[2]
            q = None
            if maps is not None:
                mean, logvar = jnp.split(self.posteriors[index - 1](
                    jnp.concatenate([h, maps[level]], axis=-1)), 2, axis=-1)
                q = (mean, soft_clamp(logvar, LOGVAR_BOUND))
        z = z_of(index, q, p)
        group = Group(z, *(q if q is not None else (zeros, zeros)), *p)
        return h + self.injections[index](z), group

    # -- the interface ---------------------------------------------------------------------

    def _split(self, vector: jax.Array) -> list[jax.Array]:
        """[N, noise_dim] -> each group f32[N, h, w, c], top-down."""
        ends = list(itertools.accumulate(math.prod(shape) for shape in self.shapes))[:-1]
        return [part.reshape(-1, *shape) for part, shape in
                zip(jnp.split(vector, ends, axis=-1), self.shapes)]

    @staticmethod
    def _join(parts: list[jax.Array]) -> jax.Array:
        return jnp.concatenate([p.reshape(p.shape[0], -1) for p in parts], axis=-1)

    def _pass(self, images, labels, vectors, *, given: bool):
        """Posterior pass for f32[..., B, noise_dim] (unit noise, or the draws if `given`):
        -> (outputs f32[..., B, M * H * W], groups, leading shape)."""
        lead, batch = vectors.shape[:-1], images.shape[0]
        repeats = math.prod(lead) // batch
        onehot = jnp.tile(self.onehot(labels), (repeats, 1))
        maps = [jnp.tile(m, (repeats, 1, 1, 1)) for m in
                self._encode_maps(images, self.onehot(labels))]
        parts = self._split(vectors.reshape(-1, vectors.shape[-1]))
        if given:
            def z_of(index, q, p):
                return parts[index]
        else:
            def z_of(index, q, p):
                return q[0] + jnp.exp(0.5 * q[1]) * parts[index]
        outputs, groups = self._top_down(onehot, z_of, maps)
        return outputs.reshape(*lead, -1), groups, lead

    def _terms(self, images, labels, *, outputs, groups, lead, sampling_prior: bool) -> Terms:
        targets = jnp.broadcast_to(images, (*lead, images.shape[-1]))
        log_px = -densities.reconstruction(outputs, targets, self.likelihood,
                                           channels=self.data.channels)

        def per_row(x):  # f32[N, h, w, c] -> f32[..., B, h * w * c]
            return x.reshape(*lead, -1)

        code, *lower = groups
        log_q = [densities.gaussian_log_density(per_row(g.z), per_row(g.q_mean),
                                                per_row(g.q_logvar)) for g in groups]
        log_p_top = self.log_prior(per_row(code.z), labels, sampling=sampling_prior)
        log_pz = sum((densities.gaussian_log_density(per_row(g.z), per_row(g.p_mean),
                                                     per_row(g.p_logvar)) for g in lower),
                     log_p_top)
        kls = _group_kls(groups, lead)
        if sampling_prior or self.prior.learned:  # the code's KL sampled
            closed = (jnp.concatenate(kls[1:], axis=-1) if len(kls) > 1
                      else jnp.zeros(log_px.shape + (0,), log_px.dtype))
            return Terms(log_px, log_pz, sum(log_q), closed, log_q[0] - log_p_top)
        return Terms(log_px, log_pz, sum(log_q), jnp.concatenate(kls, axis=-1),
                     jnp.zeros_like(log_px))

    def draws(self, images, labels, noise, *, train: bool = False) -> jax.Array:
        _, groups, lead = self._pass(images, labels, noise, given=False)
        return self._join([g.z for g in groups]).reshape(*lead, -1)

    def terms(self, images, labels, noise, *, train: bool = False,
              sampling_prior: bool = False) -> Terms:
        outputs, groups, lead = self._pass(images, labels, noise, given=False)
        return self._terms(images, labels, outputs=outputs, groups=groups, lead=lead,
                           sampling_prior=sampling_prior)

    def score(self, images, labels, z, *, train: bool = False,
              sampling_prior: bool = False) -> Terms:
        outputs, groups, lead = self._pass(images, labels, z, given=True)
        return self._terms(images, labels, outputs=outputs, groups=groups, lead=lead,
                           sampling_prior=sampling_prior)

    def encode(self, images, labels, *, train: bool = False):
        """The code's posterior q(z_code | x, y): (mean, logvar) f32[B, code_dim]."""
        maps = self._encode_maps(images, self.onehot(labels))
        mean, logvar = self._code_posterior(maps[len(self.sides) - 1])
        return mean.reshape(mean.shape[0], -1), logvar.reshape(logvar.shape[0], -1)

    def _prior_path(self, code: jax.Array, onehot: jax.Array, eps: list | None):
        """Decoder outputs for codes f32[B, code_dim], each lower group drawn from its prior
        with the unit noise `eps` (top-down, the code's first), or at its mean (None)."""
        first = code.reshape(-1, *self.shapes[0])

        def z_of(index, q, p):
            if index == 0:
                return first
            return p[0] if eps is None else p[0] + jnp.exp(0.5 * p[1]) * eps[index]

        return self._top_down(onehot, z_of, None)[0]

    def decode_onehot(self, codes, onehot, *, train: bool = False) -> jax.Array:
        return self._prior_path(codes, onehot, None)

    def generate(self, noise: jax.Array, labels: jax.Array, sample_fn=None) -> jax.Array:
        eps = self._split(noise)
        code = eps[0].reshape(eps[0].shape[0], -1)
        code = (self.draw_codes(code, labels) if sample_fn is None
                else self.draw_codes(code, labels, sample_fn))
        return self._prior_path(code, self.onehot(labels), eps)

    def reconstruct(self, images, labels):
        """(code mean, code logvar, -ELBO at every group's posterior mean): each group's KL
        in closed form, the code's against N(0, I) whatever the prior, summed over the groups'
        dimensions as training sums them (`objectives.negative_elbo`)."""
        zeros = jnp.zeros((1, images.shape[0], self.noise_dim), images.dtype)
        outputs, groups, lead = self._pass(images, labels, zeros, given=False)
        log_px = -densities.reconstruction(outputs, images, self.likelihood,
                                           channels=self.data.channels)
        neg_elbo = objectives.negative_elbo(
            log_px, jnp.concatenate(_group_kls(groups, lead), axis=-1), jnp.zeros_like(log_px))
        code = groups[0]
        return (code.q_mean.reshape(images.shape[0], -1),
                code.q_logvar.reshape(images.shape[0], -1), neg_elbo[0])


def _group_kls(groups, lead: tuple) -> list[jax.Array]:
    """Each group's closed-form KL(q || p), f32[..., B, h * w * c] (`lead` the leading shape),
    the code's first (its p is N(0, I))."""
    return [densities.gaussian_kl((g.q_mean, g.q_logvar), (g.p_mean, g.p_logvar)
                                  ).reshape(*lead, -1) for g in groups]


def _flat_outputs(maps: jax.Array, likelihood, channels: int) -> jax.Array:
    """[N, H, W, M] -> [N, M * H * W] in the likelihood's layout (each parameter's image
    together where it says so)."""
    per_value = maps.shape[-1] // channels
    if likelihood.component.parameter_major and per_value > 1:
        maps = jnp.moveaxis(maps.reshape(*maps.shape[:-1], per_value, channels), -2, 1)
    return maps.reshape(maps.shape[0], -1)
