"""The one-latent conditional VAE: MLP encoder and decoder, or with `--architecture conv` two
strided convolutions in front of the encoder and two transposed ones behind the decoder.

Encoder q(z | x, y): image and one-hot label -> hidden blocks -> one projection to 2L, split into
mean and log-variance (soft-clamped, so exp(logvar) and the KL stay finite whatever the
optimiser does). Decoder p(x | z, y): a projection of z plus a projection of the label, hidden
blocks (the label fed to each with `label_conditioning="every"`), then pixel logits.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from cvae.config.components import LikelihoodSection
from cvae.config.settings import setting
from cvae.data.specs import DatasetSpec
from cvae.model import densities, objectives
from cvae.model.interface import Family, Terms, sampled_terms
from cvae.model.layers import (ACTIVATION_FNS, block, check_conv_shape, image_features,
                               pixel_logits, soft_clamp)


@dataclasses.dataclass(frozen=True)
class Options:
    """The one-latent family's options: its networks' shape and the latent's width."""

    architecture: Literal["mlp", "conv"] = setting(
        "mlp", "Encoder and decoder: MLPs only, or with two stride-2 (transposed) convolutions.")
    hidden_sizes: tuple[int, ...] = setting(
        (512, 256), "Widths of the encoder's hidden layers (the decoder mirrors them).", low=1)
    latent_dim: int = setting(16, "Dimensions of the latent z.", low=1)
    activation: Literal["relu", "gelu", "silu", "elu", "tanh", "leaky_relu"] = setting(
        "gelu", "Activation of the hidden layers.")
    label_conditioning: Literal["first", "every"] = setting(
        "every", "Decoder: add the label at its first layer only, or feed it to every layer.")
    logvar_bound: float = setting(
        8.0, "Soft clamp of the encoder's log-variance to (-bound, bound), so the KL cannot "
             "overflow.", low=0, high=30, open_low=True)
    dropout_rate: float = setting(0.0, "Dropout after each hidden block while training (0 = "
                                       "off).", low=0, high=1, open_high=True)
    batch_norm: bool = setting(False, "BatchNorm in each hidden block (statistics kept in the "
                                      "checkpoint).")


class Encoder(nn.Module):
    options: Options
    data: DatasetSpec

    @nn.compact
    def __call__(self, images: jax.Array, onehot: jax.Array, *, train: bool):
        """images f32[B, P] in [0, 1]; onehot f32[B, C] -> mean, logvar f32[B, L]."""
        cfg = self.options
        h = jnp.concatenate([image_features(images, cfg, self.data), onehot], axis=-1)
        for width in cfg.hidden_sizes:
            h = block(cfg, width)(h, train=train)
        mean, raw_logvar = jnp.split(nn.Dense(2 * cfg.latent_dim)(h), 2, axis=-1)
        return mean, soft_clamp(raw_logvar, cfg.logvar_bound)


class Decoder(nn.Module):
    options: Options
    likelihood: LikelihoodSection
    data: DatasetSpec

    @nn.compact
    def __call__(self, z: jax.Array, onehot: jax.Array, *, train: bool) -> jax.Array:
        """z f32[B, L]; onehot f32[B, C] -> pixel logits f32[B, P]."""
        cfg = self.options
        every = cfg.label_conditioning == "every"
        widths = tuple(reversed(cfg.hidden_sizes))
        act = ACTIVATION_FNS[cfg.activation]
        h = act(nn.Dense(widths[0])(z) + nn.Dense(widths[0], use_bias=False)(onehot))
        for width in widths[1:]:
            if every:
                h = jnp.concatenate([h, onehot], axis=-1)
            h = block(cfg, width)(h, train=train)
        if every:
            h = jnp.concatenate([h, onehot], axis=-1)
        return pixel_logits(h, cfg, self.likelihood, data=self.data)


class OneLatent(Family):
    """The conditional VAE with one latent z of `latent_dim`; noise and codes are both z."""

    Options = Options

    EXPORT_MODULES = {"sample": ("decoder",), "encode": ("encoder", "decoder"),
                      "classify": ("classifier",)}
    PARAM_GROUPS = {"encoder": ("encoder",), "decoder": ("decoder",)}

    def setup(self):
        if self.options.architecture == "conv":
            check_conv_shape(self.data)
        self.encoder = Encoder(self.options, self.data)
        self.decoder = Decoder(self.options, self.likelihood, self.data)
        self.setup_prior(self.options.latent_dim,
                         logvar_bound=self.options.logvar_bound)

    def encode(self, images: jax.Array, labels: jax.Array, *, train: bool = False):
        return self.encoder(images, self.onehot(labels), train=train)

    def decode_onehot(self, codes: jax.Array, onehot: jax.Array, *,
                      train: bool = False) -> jax.Array:
        """`decode` with the label as a (possibly blended) one-hot f32[B, C]."""
        return self.decoder(codes, onehot, train=train)

    def generate(self, noise: jax.Array, labels: jax.Array, sample_fn=None) -> jax.Array:
        """Pixel logits f32[B, P] of samples: noise f32[B, L] ~ N(0, t^2 I) through the prior
        (`sample_fn`: the prior's sampling rule, or the export's copy of it)."""
        codes = (self.draw_codes(noise, labels) if sample_fn is None
                 else self.draw_codes(noise, labels, sample_fn))
        return self.decode(codes, labels)

    def draws(self, images, labels, noise, *, train: bool = False) -> jax.Array:
        mean, logvar = self.encode(images, labels, train=train)
        return mean + jnp.exp(0.5 * logvar) * noise

    def terms(self, images, labels, noise, *, train: bool = False,
              sampling_prior: bool = False) -> Terms:
        mean, logvar = self.encode(images, labels, train=train)
        z = mean + jnp.exp(0.5 * logvar) * noise
        return self._scored(images, labels, z, posterior=(mean, logvar), train=train,
                            sampling_prior=sampling_prior)

    def score(self, images, labels, z, *, train: bool = False,
              sampling_prior: bool = False) -> Terms:
        mean, logvar = self.encode(images, labels, train=train)
        return self._scored(images, labels, z, posterior=(mean, logvar), train=train,
                            sampling_prior=sampling_prior)

    def _scored(self, images, labels, z, *, posterior, train, sampling_prior) -> Terms:
        mean, logvar = posterior
        k, b = z.shape[:2]
        logits = self.decode(z.reshape(k * b, -1), jnp.tile(labels, k), train=train)
        log_px = -densities.reconstruction(logits, jnp.tile(images, (k, 1)),
                                           self.likelihood,
                                           channels=self.data.channels).reshape(k, b)
        log_qz = densities.gaussian_log_density(z, mean, logvar)
        log_pz = self.log_prior(z, labels, sampling=sampling_prior)
        if sampling_prior or self.prior.learned:
            return sampled_terms(log_px, log_pz, log_qz)
        kl = jnp.broadcast_to(densities.kl_per_dimension(mean, logvar), z.shape)
        return Terms(log_px, log_pz, log_qz, kl, jnp.zeros_like(log_px))

    def reconstruct(self, images: jax.Array, labels: jax.Array):
        """(mean, logvar f32[B, L], -ELBO f32[B] at z = the posterior mean): deterministic,
        and lowest for the label that explains the image best. Its KL is the closed form
        against N(0, I), whatever the prior (`objectives.negative_elbo`)."""
        mean, logvar = self.encode(images, labels)
        log_px = -densities.reconstruction(self.decode(mean, labels), images, self.likelihood,
                                           channels=self.data.channels)
        return mean, logvar, objectives.negative_elbo(
            log_px, densities.kl_per_dimension(mean, logvar), jnp.zeros_like(log_px))

    @staticmethod
    def widths(options: Options, data) -> tuple[int, int]:
        """(noise width, code width) of these options, without building the model."""
        return options.latent_dim, options.latent_dim
