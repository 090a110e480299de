"""A class-conditional ladder VAE (Sønderby et al. 2016): two or more stochastic layers.

Generative model, top down: z_n ~ p(z_n | y) (N(0, I), or a learned prior through
`log_prior_terms`' `log_top_prior`); for l < n, z_l ~ N(mu_td, sigma_td^2), an MLP of
(z_{l+1}, y); x ~ p(x | z_1, ..., z_n, y), a decoder that reads every layer (skip connections,
so an upper layer cannot be ignored by a decoder that only sees z_1).

Inference shares the top-down networks. A deterministic bottom-up pass d_1 = f_1(x, y),
d_l = f_l(d_{l-1}) gives each layer a Gaussian (mu_bu, sigma_bu); the top layer's posterior is
its own bottom-up Gaussian; below it, q(z_l | z_{l+1}, x, y) is the precision-weighted product
of the bottom-up Gaussian and the top-down prior at the posterior draw z_{l+1} (`combine`).
Per-layer KL terms (`layer_kls`, analytic between the two Gaussians of each layer, given the
draw above) let free bits and KL warm-up act layer by layer; `log_q` and `log_p` give the
log densities of a draw for importance weighting.

Latent vectors, everywhere they cross this module, are the layers concatenated top layer first:
[z_n, z_{n-1}, ..., z_1] (`total_dim` wide). So `generate(noise, labels)` takes one N(0, t^2 I)
vector per sample as the sampler's contract wants, its first entries the top layer's (where
cvae/model/prior.py reads its component from noise[0]). `encode` gives the top layer's
posterior (mean, logvar): the codes the transfer, walks and the fitted mixture work on;
`decode(codes)` decodes a top-layer code with every layer below at its top-down mean.
`posterior_means` and `decode_all` carry every layer, for reconstructions with all their detail.

MLPs only (Dense + activation); the bottom-up and decoder widths are `hidden_sizes`, the upper
bottom-up and top-down MLPs one layer of `upper_width`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from cvae.config import NUM_CLASSES, Config
from cvae.model import learned_prior
from cvae.model import prior as prior_lib
from cvae.model.networks import ACTIVATION_FNS, IMAGE_PIXELS, soft_clamp
from cvae.model.objectives import gaussian_log_density
from cvae.model.widths import layer_dims


class LayerTerms(NamedTuple):
    """One stochastic layer of a forward pass; arrays f32[..., B, L_l]."""

    z: jax.Array  # the posterior draw
    q_mean: jax.Array
    q_logvar: jax.Array
    p_mean: jax.Array  # the prior given the draw above (zeros at the top: N(0, I))
    p_logvar: jax.Array


class LadderOutputs(NamedTuple):
    logits: jax.Array  # pixel logits f32[..., B, 784]
    layers: tuple[LayerTerms, ...]  # bottom layer first


def combine(bottom_up: tuple, top_down: tuple) -> tuple[jax.Array, jax.Array]:
    """The precision-weighted product of two Gaussians, normalised: sigma_q^2 = 1 /
    (sigma_bu^-2 + sigma_td^-2), mu_q = (mu_bu sigma_bu^-2 + mu_td sigma_td^-2) sigma_q^2.
    In log-variances, so that neither precision overflows: each mean's weight is a sigmoid.
    bottom_up, top_down: (mean, logvar) each."""
    (mean_bu, logvar_bu), (mean_td, logvar_td) = bottom_up, top_down
    logvar = -jnp.logaddexp(-logvar_bu, -logvar_td)
    mean = mean_bu * jax.nn.sigmoid(logvar_td - logvar_bu) + \
        mean_td * jax.nn.sigmoid(logvar_bu - logvar_td)
    return mean, logvar


def gaussian_kl(q: tuple, p: tuple) -> jax.Array:
    """KL(N(q) || N(p)) per dimension, diagonal Gaussians; q, p: (mean, logvar) each."""
    (q_mean, q_logvar), (p_mean, p_logvar) = q, p
    return 0.5 * (p_logvar - q_logvar - 1.0
                  + (jnp.exp(q_logvar) + jnp.square(q_mean - p_mean)) * jnp.exp(-p_logvar))


def layer_kls(outputs: LadderOutputs) -> tuple[jax.Array, ...]:
    """Each layer's KL per dimension, f32[..., B, L_l], bottom first (the top's against N(0, I);
    with a learned top prior use log_q - log_p for it)."""
    return tuple(gaussian_kl((t.q_mean, t.q_logvar), (t.p_mean, t.p_logvar))
                 for t in outputs.layers)


def log_q(outputs: LadderOutputs) -> jax.Array:
    """log q(z | x, y) of the draw: f32[..., B]."""
    return sum(gaussian_log_density(t.z, t.q_mean, t.q_logvar) for t in outputs.layers)


def log_p(outputs: LadderOutputs, labels: jax.Array,
          log_top_prior: Callable | None = None) -> jax.Array:
    """log p(z | y) of the draw: f32[..., B]; `log_top_prior(z_top, labels)` replaces the top
    layer's N(0, I) (a learned prior, cvae/model/learned_prior.py)."""
    *lower, top = outputs.layers
    total = sum((gaussian_log_density(t.z, t.p_mean, t.p_logvar) for t in lower),
                jnp.zeros(top.z.shape[:-1], top.z.dtype))
    if log_top_prior is None:
        return total + gaussian_log_density(top.z, top.p_mean, top.p_logvar)
    return total + log_top_prior(top.z, labels)


class _MLP(nn.Module):
    widths: tuple[int, ...]
    activation: str

    @nn.compact
    def __call__(self, h: jax.Array) -> jax.Array:
        for width in self.widths:
            h = ACTIVATION_FNS[self.activation](nn.Dense(width)(h))
        return h


class _Gaussian(nn.Module):
    """Dense -> (mean, soft-clamped logvar)."""

    dim: int
    logvar_bound: float

    @nn.compact
    def __call__(self, h: jax.Array) -> tuple[jax.Array, jax.Array]:
        mean, raw = jnp.split(nn.Dense(2 * self.dim)(h), 2, axis=-1)
        return mean, soft_clamp(raw, self.logvar_bound)


def _with_label(h: jax.Array, onehot: jax.Array) -> jax.Array:
    """Concatenate the one-hot label [B, 10] to h [..., B, W], broadcasting leading axes."""
    return jnp.concatenate([h, jnp.broadcast_to(onehot, h.shape[:-1] + onehot.shape[-1:])], -1)


class LadderCVAE(nn.Module):
    """The ladder VAE; `latent_dims` bottom layer first, e.g. (16, 8). Labels are i32[B]."""

    latent_dims: tuple[int, ...]
    hidden_sizes: tuple[int, ...] = (512, 256)
    upper_width: int = 256
    activation: str = "gelu"
    logvar_bound: float = 8.0
    label_every_layer: bool = True  # the decoder reads the label at every layer, not the first
    # p(z_top | y): "standard" N(0, I); "mixture" fitted after training; "vamp" or
    # "learned_mixture" learnt with the model (`prior_mixture`). Every prior but the standard
    # one samples from the "prior" collection (cvae/model/prior.py's format).
    prior: str = "standard"
    prior_components: int = 10  # a class's components (pseudo-inputs for "vamp")
    config: Config | None = None  # the config it was made from (`create_ladder`), as CVAE's

    @property
    def has_classifier(self) -> bool:
        """No q(y|x): the ladder trains with every label (it reads digits by Bayes' rule)."""
        return False

    def setup(self):
        n, act = len(self.latent_dims), self.activation
        if self.prior == "vamp":
            self.pseudo_inputs = learned_prior.PseudoInputs(self.prior_components)
        elif self.prior == "learned_mixture":
            self.learned = learned_prior.GaussianMixturePrior(
                self.prior_components, self.latent_dims[-1], logvar_bound=self.logvar_bound)
        where = (prior_lib.COLLECTION, prior_lib.VARIABLE)
        if self.prior != "standard" and (self.is_initializing() or self.has_variable(*where)):
            self.mixture = self.variable(*where, prior_lib.standard_mixture, NUM_CLASSES,
                                         self.prior_components, self.latent_dims[-1])
        self.bottom = _MLP(self.hidden_sizes, act)
        self.upper = [_MLP((self.upper_width,), act) for _ in range(n - 1)]
        self.bottom_up_heads = [_Gaussian(d, self.logvar_bound) for d in self.latent_dims]
        self.top_down_nets = [_MLP((self.upper_width,), act) for _ in range(n - 1)]
        self.top_down_heads = [_Gaussian(d, self.logvar_bound) for d in self.latent_dims[:-1]]
        self.decoder_layers = [nn.Dense(w) for w in reversed(self.hidden_sizes)]
        self.pixels = nn.Dense(IMAGE_PIXELS)

    @property
    def total_dim(self) -> int:
        return sum(self.latent_dims)

    def split(self, vector: jax.Array) -> list[jax.Array]:
        """[..., total_dim] (top layer first) -> one array per layer, bottom layer first."""
        ends, end = [], 0
        for dim in self.latent_dims[::-1][:-1]:
            end += dim
            ends.append(end)
        return jnp.split(vector, ends, axis=-1)[::-1]

    @staticmethod
    def join(parts: list[jax.Array]) -> jax.Array:
        """One array per layer, bottom first -> [..., total_dim], top layer first."""
        return jnp.concatenate(parts[::-1], axis=-1)

    def bottom_up(self, images: jax.Array, onehot: jax.Array) -> list[tuple[jax.Array, ...]]:
        """images f32[B, 784], onehot f32[B, 10] -> each layer's (mean, logvar), bottom first."""
        d = self.bottom(jnp.concatenate([images, onehot], axis=-1))
        gaussians = [self.bottom_up_heads[0](d)]
        for layer in range(1, len(self.latent_dims)):
            d = self.upper[layer - 1](d)
            gaussians.append(self.bottom_up_heads[layer](d))
        return gaussians

    def top_down(self, layer: int, z_above: jax.Array, onehot: jax.Array):
        """p(z_layer | z_layer+1, y): (mean, logvar) f32[..., B, L_layer]."""
        return self.top_down_heads[layer](self.top_down_nets[layer](_with_label(z_above, onehot)))

    def __call__(self, images: jax.Array, labels: jax.Array, noise: jax.Array, *,
                 train: bool = False) -> LadderOutputs:
        """images f32[B, 784] in [0, 1], labels i32[B], noise f32[..., B, total_dim] (unit
        normals, top layer first; leading axes are importance samples) -> the draw, its
        layers' Gaussians and the decoder's logits. (`train`: the CVAE's signature; no layer
        here behaves differently in training.)"""
        del train
        eps = self.split(noise)
        return self._walk(images, labels, eps[-1].shape, z_of=
                          lambda layer, mean, logvar: mean + jnp.exp(0.5 * logvar) * eps[layer])

    def score(self, images: jax.Array, labels: jax.Array, z: jax.Array) -> LadderOutputs:
        """Given draws z f32[..., B, total_dim] (top first), scored: each layer's posterior
        and prior recomputed at the given z above it (not redrawn), and the decoder's logits.
        With a draw of `__call__` it gives that call's outputs; DReG evaluates log q and
        log p of fixed draws with it (cvae/model/objectives.py)."""
        given = self.split(z)
        return self._walk(images, labels, given[-1].shape, z_of=lambda layer, *_: given[layer])

    def _walk(self, images, labels, top_shape, *, z_of: Callable) -> LadderOutputs:
        """The top-down pass: z_of(layer, q_mean, q_logvar) gives each layer's z."""
        onehot = jax.nn.one_hot(labels, NUM_CLASSES)
        bottom_up = self.bottom_up(images, onehot)
        top = len(self.latent_dims) - 1
        mean, logvar = (jnp.broadcast_to(a, top_shape) for a in bottom_up[top])
        z = z_of(top, mean, logvar)
        layers = [LayerTerms(z, mean, logvar, jnp.zeros_like(z), jnp.zeros_like(z))]
        for layer in reversed(range(top)):
            p_mean, p_logvar = self.top_down(layer, z, onehot)
            q_mean, q_logvar = combine(bottom_up[layer], (p_mean, p_logvar))
            z = z_of(layer, q_mean, q_logvar)
            layers.insert(0, LayerTerms(z, q_mean, q_logvar, p_mean, p_logvar))
        logits = self.decode_all(self.join([t.z for t in layers]), labels)
        return LadderOutputs(logits, tuple(layers))

    def decode_all(self, z: jax.Array, labels: jax.Array, *, train: bool = False) -> jax.Array:
        """Every layer's z f32[..., B, total_dim] (top first) -> pixel logits f32[..., B, 784]."""
        del train
        return self._decode_all(z, jax.nn.one_hot(labels, NUM_CLASSES))

    def _decode_all(self, z: jax.Array, onehot: jax.Array) -> jax.Array:
        act = ACTIVATION_FNS[self.activation]
        h = act(self.decoder_layers[0](_with_label(z, onehot)))
        for dense in self.decoder_layers[1:]:
            h = act(dense(_with_label(h, onehot) if self.label_every_layer else h))
        return self.pixels(_with_label(h, onehot) if self.label_every_layer else h)

    def prior_path(self, z_top: jax.Array, labels: jax.Array, eps: list[jax.Array]) -> jax.Array:
        """z_top f32[B, L_n] and unit normals for the layers below (bottom first) -> every
        layer's z from the top-down priors, f32[B, total_dim]."""
        return self._prior_path(z_top, jax.nn.one_hot(labels, NUM_CLASSES), eps)

    def _prior_path(self, z_top: jax.Array, onehot: jax.Array, eps: list[jax.Array]):
        parts, z = [z_top], z_top
        for layer in reversed(range(len(self.latent_dims) - 1)):
            mean, logvar = self.top_down(layer, z, onehot)
            z = mean + jnp.exp(0.5 * logvar) * eps[layer]
            parts.insert(0, z)
        return self.join(parts)

    def prior_mixture(self):
        """The learned p(z_top | y) as a diagonal mixture (log_weights f32[10, K], means, logvars
        f32[10, K, L_top]) from the current parameters; None for the other priors."""
        if self.prior == "vamp":
            return learned_prior.vamp_components(self.encode, self.pseudo_inputs())
        if self.prior == "learned_mixture":
            return self.learned()
        return None

    def init_all(self, images, labels, noise):
        """Touch every part (the ladder and a learned prior) so `init` creates them all."""
        return self(images, labels, noise), self.prior_mixture()

    def generate(self, noise: jax.Array, labels: jax.Array,
                 top_prior_sample: Callable | None = None) -> jax.Array:
        """Pixel logits f32[B, 784] of samples: noise f32[B, total_dim] ~ N(0, t^2 I), one
        vector per sample, top layer first; `top_prior_sample(noise_top, labels)` maps the top
        layer's share through a prior other than N(0, I) (by default, the "prior" collection's
        mixture where the model has one)."""
        eps = self.split(noise)
        if top_prior_sample is None:
            mixture = None if self.prior == "standard" else self.mixture.value
            z_top = prior_lib.draw(eps[-1], labels, mixture=mixture,
                                   truncation=self.config.truncation if self.config else 1.0)
        else:
            z_top = top_prior_sample(eps[-1], labels)
        return self.decode_all(self.prior_path(z_top, labels, eps), labels)

    def encode(self, images: jax.Array, labels: jax.Array, *, train: bool = False):
        """The top layer's posterior q(z_n | x, y): (mean, logvar) f32[B, L_n]."""
        del train
        return self.bottom_up(images, jax.nn.one_hot(labels, NUM_CLASSES))[-1]

    def decode(self, codes: jax.Array, labels: jax.Array, *, train: bool = False) -> jax.Array:
        """Top-layer codes f32[B, L_n] -> logits, each layer below at its top-down mean."""
        del train
        return self.decode_onehot(codes, jax.nn.one_hot(labels, NUM_CLASSES))

    def decode_onehot(self, codes: jax.Array, onehot: jax.Array) -> jax.Array:
        """`decode` with the label as a (possibly blended) one-hot f32[B, 10]: what the
        reports' interpolation between two classes decodes."""
        zeros = [jnp.zeros(codes.shape[:-1] + (d,), codes.dtype) for d in self.latent_dims]
        return self._decode_all(self._prior_path(codes, onehot, zeros), onehot)

    def posterior_means(self, images: jax.Array, labels: jax.Array) -> jax.Array:
        """Every layer's posterior mean, top down (each given the means above): f32[B, total]."""
        zeros = jnp.zeros((images.shape[0], self.total_dim), images.dtype)
        return self.join([t.q_mean for t in self(images, labels, zeros).layers])


def create_ladder(config: Config) -> LadderCVAE:
    """The ladder VAE a config asks for: `stochastic_layers` layers, the bottom one of
    `latent_dim` dimensions, each above of `upper_latent_dim`; upper MLPs as wide as the last
    hidden layer."""
    components = config.pseudo_inputs if config.prior == "vamp" else config.prior_components
    return LadderCVAE(latent_dims=layer_dims(config), hidden_sizes=config.hidden_sizes,
                      upper_width=config.hidden_sizes[-1], activation=config.activation,
                      logvar_bound=config.logvar_bound,
                      label_every_layer=config.label_conditioning == "every",
                      prior=config.prior, prior_components=components, config=config)


def init_ladder(model: LadderCVAE, key: jax.Array) -> dict:
    """Parameters (and a learned prior's) for a batch of one."""
    return model.init(key, jnp.zeros((1, IMAGE_PIXELS)), jnp.zeros((1,), jnp.int32),
                      jnp.zeros((1, sum(model.latent_dims))), method=LadderCVAE.init_all)
