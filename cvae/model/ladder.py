"""A class-conditional ladder VAE (Sønderby et al. 2016): two or more stochastic layers.

Generative model, top down: z_n ~ p(z_n | y), the family's prior over codes; for l < n,
z_l ~ N(mu_td, sigma_td^2), an MLP of (z_{l+1}, y); x ~ p(x | z_1, ..., z_n, y), a decoder that
reads every layer (skip connections, so an upper layer cannot be ignored by a decoder that only
sees z_1).

Inference shares the top-down networks. A deterministic bottom-up pass d_1 = f_1(x, y),
d_l = f_l(d_{l-1}) gives each layer a Gaussian (mu_bu, sigma_bu); the top layer's posterior is
its own bottom-up Gaussian; below it, q(z_l | z_{l+1}, x, y) is the precision-weighted product
of the bottom-up Gaussian and the top-down prior at the posterior draw z_{l+1} (`combine`).
Each layer's KL given the draw above is in closed form, so free bits act layer by layer.

Latent vectors are the layers concatenated top layer first, [z_n, ..., z_1] (`noise_dim` wide):
one N(0, t^2 I) vector per sample, its first entries the top layer's, which the prior reads.
Codes are the top layer's: `encode` gives its posterior; `decode(codes)` decodes a top-layer
code with every layer below at its top-down mean.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from cvae.config.components import LikelihoodSection
from cvae.config.settings import setting
from cvae.data.specs import DatasetSpec
from cvae.model import densities, objectives
from cvae.model.interface import Family, Terms
from cvae.model.layers import (ACTIVATION_FNS, after_dense, check_conv_shape, image_features,
                               output_width, pixel_logits, soft_clamp)
from cvae.model.one_latent import Options as OneLatentOptions

MAX_STOCHASTIC_LAYERS = 5  # the ladder VAE's depth on MNIST in Sonderby et al. 2016


@dataclasses.dataclass(frozen=True)
class Options(OneLatentOptions):
    """The one-latent family's options, and the ladder's layers above the bottom one (whose
    width is `latent_dim`)."""

    stochastic_layers: int = setting(
        2, "Latent layers of the ladder, --latent-dim the lowest.", low=2,
        high=MAX_STOCHASTIC_LAYERS)
    upper_latent_dim: int = setting(8, "Dimensions of each ladder layer above the bottom one.",
                                    low=1)


class LayerTerms(NamedTuple):
    """One stochastic layer of a pass; arrays f32[..., B, L_l]."""

    z: jax.Array  # the posterior draw
    q_mean: jax.Array
    q_logvar: jax.Array
    p_mean: jax.Array  # the prior given the draw above (zeros at the top: N(0, I))
    p_logvar: jax.Array


def combine(bottom_up: tuple, top_down: tuple) -> tuple[jax.Array, jax.Array]:
    """The precision-weighted product of two Gaussians, normalised: sigma_q^2 = 1 /
    (sigma_bu^-2 + sigma_td^-2), mu_q = (mu_bu sigma_bu^-2 + mu_td sigma_td^-2) sigma_q^2.
    In log-variances, so that neither precision overflows: each mean's weight is a sigmoid."""
    (mean_bu, logvar_bu), (mean_td, logvar_td) = bottom_up, top_down
    logvar = -jnp.logaddexp(-logvar_bu, -logvar_td)
    mean = mean_bu * jax.nn.sigmoid(logvar_td - logvar_bu) + \
        mean_td * jax.nn.sigmoid(logvar_bu - logvar_td)
    return mean, logvar


def layer_dims(options: Options) -> tuple[int, ...]:
    """The stochastic layers' widths, bottom first: `latent_dim`, then `upper_latent_dim`."""
    return (options.latent_dim,) + (options.upper_latent_dim,) * (options.stochastic_layers - 1)


def _with_label(h: jax.Array, onehot: jax.Array) -> jax.Array:
    """Concatenate the one-hot label [B, C] to h [..., B, W], broadcasting leading axes."""
    return jnp.concatenate([h, jnp.broadcast_to(onehot, h.shape[:-1] + onehot.shape[-1:])], -1)


class _MLP(nn.Module):
    """Dense -> (BatchNorm) -> activation -> (Dropout), per width; with `stem` the image's
    convolutional features first (`architecture="conv"`), the label after them."""

    widths: tuple[int, ...]
    options: Options
    data: DatasetSpec | None = None  # the stem's image shape; None: no stem

    @nn.compact
    def __call__(self, h: jax.Array, onehot: jax.Array | None = None, *,
                 train: bool) -> jax.Array:
        cfg = self.options
        if self.data is not None:
            h = image_features(h, cfg, self.data)
        if onehot is not None:
            h = _with_label(h, onehot)
        for width in self.widths:
            h = after_dense(nn.Dense(width)(h), cfg, train=train)
        return h


class _Post(nn.Module):
    """What follows a decoder layer's dense map: (BatchNorm) -> activation -> (Dropout)."""

    options: Options

    @nn.compact
    def __call__(self, h: jax.Array, *, train: bool) -> jax.Array:
        return after_dense(h, self.options, train=train)


class _Gaussian(nn.Module):
    """Dense -> (mean, soft-clamped logvar)."""

    dim: int
    logvar_bound: float

    @nn.compact
    def __call__(self, h: jax.Array) -> tuple[jax.Array, jax.Array]:
        mean, raw = jnp.split(nn.Dense(2 * self.dim)(h), 2, axis=-1)
        return mean, soft_clamp(raw, self.logvar_bound)


class _PixelHead(nn.Module):
    options: Options
    likelihood: LikelihoodSection
    data: DatasetSpec

    @nn.compact
    def __call__(self, h: jax.Array) -> jax.Array:
        return pixel_logits(h, self.options, self.likelihood, data=self.data)


_DOWN = ("top_down_nets", "top_down_heads", "decoder_layers", "decoder_blocks", "pixels")


class Ladder(Family):
    """The ladder VAE; `layer_dims(options)` bottom layer first, e.g. (16, 8)."""

    Options = Options

    EXPORT_MODULES = {"sample": _DOWN,
                      "encode": ("bottom", "upper", "bottom_up_heads", *_DOWN),
                      "classify": ("classifier",)}
    PARAM_GROUPS = {"encoder": ("bottom", "upper", "bottom_up_heads"), "decoder": _DOWN}

    def setup(self):
        cfg, dims = self.options, self.latent_dims
        if cfg.architecture == "conv":
            check_conv_shape(self.data)
        n, upper = len(dims), cfg.hidden_sizes[-1]
        self.bottom = _MLP(cfg.hidden_sizes, cfg, self.data)
        self.upper = [_MLP((upper,), cfg) for _ in range(n - 1)]
        self.bottom_up_heads = [_Gaussian(d, cfg.logvar_bound) for d in dims]
        self.top_down_nets = [_MLP((upper,), cfg) for _ in range(n - 1)]
        self.top_down_heads = [_Gaussian(d, cfg.logvar_bound) for d in dims[:-1]]
        self.decoder_layers = [nn.Dense(w) for w in reversed(cfg.hidden_sizes)]
        if cfg.batch_norm or cfg.dropout_rate > 0:
            self.decoder_blocks = [_Post(cfg) for _ in cfg.hidden_sizes]
        self.pixels = (_PixelHead(cfg, self.likelihood, self.data) if cfg.architecture == "conv"
                       else nn.Dense(output_width(self.likelihood, self.data)))
        self.setup_prior(dims[-1], logvar_bound=cfg.logvar_bound)

    @property
    def latent_dims(self) -> tuple[int, ...]:
        return layer_dims(self.options)

    @staticmethod
    def widths(options: Options, data) -> tuple[int, int]:
        """(noise width: every layer's, code width: the top layer's), without building it."""
        dims = layer_dims(options)
        return sum(dims), dims[-1]

    def split(self, vector: jax.Array) -> list[jax.Array]:
        """[..., noise_dim] (top layer first) -> one array per layer, bottom layer first."""
        ends, end = [], 0
        for dim in self.latent_dims[::-1][:-1]:
            end += dim
            ends.append(end)
        return jnp.split(vector, ends, axis=-1)[::-1]

    @staticmethod
    def join(parts: list[jax.Array]) -> jax.Array:
        """One array per layer, bottom first -> [..., noise_dim], top layer first."""
        return jnp.concatenate(parts[::-1], axis=-1)

    def bottom_up(self, images, onehot, *, train: bool = False) -> list[tuple]:
        """Each layer's bottom-up (mean, logvar), bottom first."""
        d = self.bottom(images, onehot, train=train)
        gaussians = [self.bottom_up_heads[0](d)]
        for layer in range(1, len(self.latent_dims)):
            d = self.upper[layer - 1](d, train=train)
            gaussians.append(self.bottom_up_heads[layer](d))
        return gaussians

    def top_down(self, layer: int, z_above, onehot, *, train: bool = False):
        """p(z_layer | z_layer+1, y): (mean, logvar) f32[..., B, L_layer]."""
        return self.top_down_heads[layer](
            self.top_down_nets[layer](z_above, onehot, train=train))

    def _walk(self, images, labels, top_shape, *, z_of: Callable, train: bool):
        """The top-down pass: z_of(layer, q_mean, q_logvar) gives each layer's z.
        -> (pixel logits, layers bottom first)."""
        onehot = self.onehot(labels)
        bottom_up = self.bottom_up(images, onehot, train=train)
        top = len(self.latent_dims) - 1
        mean, logvar = (jnp.broadcast_to(a, top_shape) for a in bottom_up[top])
        z = z_of(top, mean, logvar)
        layers = [LayerTerms(z, mean, logvar, jnp.zeros_like(z), jnp.zeros_like(z))]
        for layer in reversed(range(top)):
            p_mean, p_logvar = self.top_down(layer, z, onehot, train=train)
            q_mean, q_logvar = combine(bottom_up[layer], (p_mean, p_logvar))
            z = z_of(layer, q_mean, q_logvar)
            layers.insert(0, LayerTerms(z, q_mean, q_logvar, p_mean, p_logvar))
        logits = self._decode_all(self.join([t.z for t in layers]), onehot, train=train)
        return logits, tuple(layers)

    def _pass(self, images, labels, noise, *, train: bool):
        eps = self.split(noise)
        return self._walk(images, labels, eps[-1].shape, train=train, z_of=lambda layer, mean,
                          logvar: mean + jnp.exp(0.5 * logvar) * eps[layer])

    def _decode_all(self, z, onehot, *, train: bool = False) -> jax.Array:
        """Every layer's z f32[..., B, noise_dim] -> pixel logits f32[..., B, P]."""
        every = self.options.label_conditioning == "every"
        h = _with_label(z, onehot)
        for i, dense in enumerate(self.decoder_layers):
            h = dense(_with_label(h, onehot) if (i and every) else h)
            h = (self.decoder_blocks[i](h, train=train) if hasattr(self, "decoder_blocks")
                 else ACTIVATION_FNS[self.options.activation](h))
        return self.pixels(_with_label(h, onehot) if every else h)

    def draws(self, images, labels, noise, *, train: bool = False) -> jax.Array:
        _, layers = self._pass(images, labels, noise, train=train)
        return self.join([t.z for t in layers])

    def terms(self, images, labels, noise, *, train: bool = False,
              sampling_prior: bool = False) -> Terms:
        logits, layers = self._pass(images, labels, noise, train=train)
        return self._terms(images, labels, logits=logits, layers=layers,
                           sampling_prior=sampling_prior)

    def score(self, images, labels, z, *, train: bool = False,
              sampling_prior: bool = False) -> Terms:
        """Terms of given draws z f32[..., B, noise_dim]: each layer's posterior and prior
        recomputed at the given z above it (not redrawn)."""
        given = self.split(z)
        out = self._walk(images, labels, given[-1].shape, train=train,
                         z_of=lambda layer, *_: given[layer])
        return self._terms(images, labels, logits=out[0], layers=out[1],
                           sampling_prior=sampling_prior)

    def _terms(self, images, labels, *, logits, layers, sampling_prior) -> Terms:
        targets = jnp.broadcast_to(images, logits.shape[:-1] + images.shape[-1:])
        log_px = -densities.reconstruction(logits, targets, self.likelihood,
                                           channels=self.data.channels)
        *lower, top = layers
        log_q = [densities.gaussian_log_density(t.z, t.q_mean, t.q_logvar) for t in layers]
        log_p_lower = [densities.gaussian_log_density(t.z, t.p_mean, t.p_logvar) for t in lower]
        log_p_top = self.log_prior(top.z, labels, sampling=sampling_prior)
        log_qz = sum(log_q)
        log_pz = sum(log_p_lower, log_p_top)
        kls = _layer_kls(layers)
        if sampling_prior or self.prior.learned:  # the top layer's KL sampled
            return Terms(log_px, log_pz, log_qz, self.join(kls[:-1]), log_q[-1] - log_p_top)
        return Terms(log_px, log_pz, log_qz, self.join(kls), jnp.zeros_like(log_px))

    def encode(self, images, labels, *, train: bool = False):
        """The top layer's posterior q(z_n | x, y): (mean, logvar) f32[B, L_n]."""
        return self.bottom_up(images, self.onehot(labels), train=train)[-1]

    def decode_onehot(self, codes, onehot, *, train: bool = False) -> jax.Array:
        """Top-layer codes f32[B, L_n] -> logits, each layer below at its top-down mean."""
        zeros = [jnp.zeros(codes.shape[:-1] + (d,), codes.dtype) for d in self.latent_dims]
        return self._decode_all(self._prior_path(codes, onehot, zeros), onehot, train=train)

    def _prior_path(self, z_top, onehot, eps: list[jax.Array]) -> jax.Array:
        """z_top and unit normals for the layers below (bottom first) -> every layer's z from
        the top-down priors, f32[B, noise_dim]."""
        parts, z = [z_top], z_top
        for layer in reversed(range(len(self.latent_dims) - 1)):
            mean, logvar = self.top_down(layer, z, onehot)
            z = mean + jnp.exp(0.5 * logvar) * eps[layer]
            parts.insert(0, z)
        return self.join(parts)

    def generate(self, noise: jax.Array, labels: jax.Array, sample_fn=None) -> jax.Array:
        """Pixel logits f32[B, P] of samples: noise f32[B, noise_dim] ~ N(0, t^2 I), top layer
        first; the top layer's share goes through the prior (`sample_fn` as `draw_codes`')."""
        eps = self.split(noise)
        z_top = (self.draw_codes(eps[-1], labels) if sample_fn is None
                 else self.draw_codes(eps[-1], labels, sample_fn))
        onehot = self.onehot(labels)
        return self._decode_all(self._prior_path(z_top, onehot, eps), onehot)

    def reconstruct(self, images, labels):
        """(top mean, top logvar, -ELBO at every layer's posterior mean): each layer's KL in
        closed form, the top layer's against N(0, I) whatever the prior, summed over the
        layers' dimensions as training sums them (`objectives.negative_elbo`)."""
        zeros = jnp.zeros((1,) + images.shape[:1] + (self.noise_dim,), images.dtype)
        logits, layers = self._pass(images, labels, zeros, train=False)
        log_px = -densities.reconstruction(logits, images, self.likelihood,
                                           channels=self.data.channels)
        neg_elbo = objectives.negative_elbo(log_px, self.join(_layer_kls(layers)),
                                            jnp.zeros_like(log_px))
        top = layers[-1]
        return top.q_mean[0], top.q_logvar[0], neg_elbo[0]


def _layer_kls(layers) -> list[jax.Array]:
    """Each layer's closed-form KL(q || p) per dimension, bottom first (the top layer's p is
    N(0, I))."""
    return [densities.gaussian_kl((t.q_mean, t.q_logvar), (t.p_mean, t.p_logvar))
            for t in layers]
