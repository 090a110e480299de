"""The class-conditioned VAE as a Flax Linen module, and nothing about training.

Encoder q(z | x, y): image and one-hot label -> MLP (or small convnet) -> one projection to
2 * latent_dim, split into mean and log-variance. The log-variance is soft-clamped with a scaled
tanh so exp(logvar) and the KL stay finite whatever the optimiser does. Decoder p(x | z, y):
a projection of z plus a projection of the one-hot label, then an MLP (or transposed convnet)
back to 784 pixel logits. `decode` returns logits; `pixel_means` maps them to [0, 1].
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from cvae.model import convolution, learned_prior
from cvae.model import prior as prior_lib
from cvae.config import NUM_CLASSES, Config
from cvae.data.pixels import IMAGE_PIXELS, IMAGE_SHAPE

ACTIVATION_FNS: dict[str, Callable] = {
    "relu": nn.relu, "gelu": nn.gelu, "silu": nn.silu, "elu": nn.elu, "tanh": jnp.tanh,
    "leaky_relu": nn.leaky_relu,
}


def reparameterize(key: jax.Array, mean: jax.Array, logvar: jax.Array) -> jax.Array:
    """z = mean + sigma * eps: a sample whose gradient flows to mean and logvar."""
    return mean + jnp.exp(0.5 * logvar) * jax.random.normal(key, mean.shape, mean.dtype)


def soft_clamp(x: jax.Array, bound: float) -> jax.Array:
    """Smoothly squash x into (-bound, bound); identity near zero, gradients never vanish to 0."""
    return bound * jnp.tanh(x / bound)


class _Block(nn.Module):
    """Dense -> (BatchNorm) -> activation -> (Dropout)."""

    width: int
    activation: str
    dropout_rate: float
    batch_norm: bool

    @nn.compact
    def __call__(self, h: jax.Array, *, train: bool) -> jax.Array:
        h = nn.Dense(self.width)(h)
        if self.batch_norm:
            h = nn.BatchNorm(use_running_average=not train, momentum=0.9)(h)
        h = ACTIVATION_FNS[self.activation](h)
        if self.dropout_rate > 0:
            h = nn.Dropout(self.dropout_rate, deterministic=not train)(h)
        return h


def image_features(images: jax.Array, architecture: str, act: Callable) -> jax.Array:
    """float32[B, 784] -> the features the MLP reads: the pixels themselves, or two strided
    convolutions' maps flattened for `architecture="conv"`. Called inside a module's compact
    `__call__`, so its layers are that module's own (Conv_0, Conv_1)."""
    if architecture != "conv":
        return images
    h = images.reshape(-1, *IMAGE_SHAPE, 1)
    h = act(convolution.Conv(32)(h))  # 14x14
    h = act(convolution.Conv(64)(h))  # 7x7
    return h.reshape(h.shape[0], -1)


class Encoder(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, images: jax.Array, onehot: jax.Array, *, train: bool):
        """images: float32[B, 784] in [0, 1]; onehot: float32[B, 10] -> mean, logvar [B, L]."""
        cfg = self.config
        act = ACTIVATION_FNS[cfg.activation]
        h = image_features(images, cfg.architecture, act)
        h = jnp.concatenate([h, onehot], axis=-1)
        for width in cfg.hidden_sizes:
            h = _Block(width, cfg.activation, cfg.dropout_rate, cfg.batch_norm)(h, train=train)
        mean, raw_logvar = jnp.split(nn.Dense(2 * cfg.latent_dim)(h), 2, axis=-1)
        return mean, soft_clamp(raw_logvar, cfg.logvar_bound)


class Decoder(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, z: jax.Array, onehot: jax.Array, *, train: bool) -> jax.Array:
        """z: float32[B, L]; onehot: float32[B, 10] -> pixel logits float32[B, 784]."""
        cfg = self.config
        act = ACTIVATION_FNS[cfg.activation]
        widths = tuple(reversed(cfg.hidden_sizes))
        h = act(nn.Dense(widths[0])(z) + nn.Dense(widths[0], use_bias=False)(onehot))
        for width in widths[1:]:
            if cfg.label_conditioning == "every":  # the label reaches every layer, not just one
                h = jnp.concatenate([h, onehot], axis=-1)
            h = _Block(width, cfg.activation, cfg.dropout_rate, cfg.batch_norm)(h, train=train)
        if cfg.label_conditioning == "every":
            h = jnp.concatenate([h, onehot], axis=-1)
        if cfg.architecture == "conv":
            h = act(nn.Dense(7 * 7 * 64)(h)).reshape(-1, 7, 7, 64)
            h = act(convolution.ConvTranspose(32)(h))  # 14x14
            h = convolution.ConvTranspose(1)(h)  # 28x28
            return h.reshape(h.shape[0], IMAGE_PIXELS)
        return nn.Dense(IMAGE_PIXELS)(h)


class Classifier(nn.Module):
    """q(y | x) of the semi-supervised model (M2): image -> class logits, an MLP of the
    encoder's widths (its convolutions first with `architecture="conv"`)."""

    config: Config

    @nn.compact
    def __call__(self, images: jax.Array, *, train: bool) -> jax.Array:
        """images: float32[B, 784] in [0, 1] -> logits float32[B, 10]."""
        cfg = self.config
        act = ACTIVATION_FNS[cfg.activation]
        h = image_features(images, cfg.architecture, act)
        for width in cfg.hidden_sizes:
            h = _Block(width, cfg.activation, cfg.dropout_rate, cfg.batch_norm)(h, train=train)
        return nn.Dense(NUM_CLASSES)(h)


class CVAE(nn.Module):
    """Conditional VAE; `labels` are int32[B] digits 0-9.

    The prior p(z | y) is N(0, I), or with `prior="mixture"` a per-class Gaussian mixture kept
    in the variable collection "prior" and fitted to the codes at each evaluation
    (`cvae.model.prior`). Training's KL always uses N(0, I); `generate` and `log_prior` use the
    prior the run has.
    """

    config: Config

    @property
    def has_classifier(self) -> bool:
        """Whether the model learns q(y|x): trained with few labels (`--labels N`), not all."""
        return self.config.labelled_count is not None

    def setup(self):
        self.encoder = Encoder(self.config)
        self.decoder = Decoder(self.config)
        cfg = self.config
        if self.has_classifier:
            self.classifier = Classifier(cfg)
        # Declared only where it exists (init, or variables that carry it): the train step
        # applies the model without it.
        where = (prior_lib.COLLECTION, prior_lib.VARIABLE)
        if cfg.prior != "standard" and (self.is_initializing() or self.has_variable(*where)):
            self.mixture = self.variable(*where, prior_lib.standard_mixture, NUM_CLASSES,
                                         prior_components(cfg), cfg.latent_dim)
        if cfg.prior == "vamp":  # learnt with the model (cvae/model/learned_prior.py)
            self.pseudo_inputs = learned_prior.PseudoInputs(cfg.pseudo_inputs)
        elif cfg.prior == "learned_mixture":
            self.learned = learned_prior.GaussianMixturePrior(
                cfg.prior_components, cfg.latent_dim, logvar_bound=cfg.logvar_bound)

    def encode(self, images: jax.Array, labels: jax.Array, *, train: bool = False):
        return self.encoder(images, jax.nn.one_hot(labels, NUM_CLASSES), train=train)

    def decode(self, z: jax.Array, labels: jax.Array, *, train: bool = False) -> jax.Array:
        return self.decoder(z, jax.nn.one_hot(labels, NUM_CLASSES), train=train)

    def decode_onehot(self, z: jax.Array, onehot: jax.Array) -> jax.Array:
        """`decode` with the label as a (possibly blended) one-hot f32[B, 10]."""
        return self.decoder(z, onehot, train=False)

    def classify(self, images: jax.Array, *, train: bool = False) -> jax.Array:
        """Logits of q(y | x), float32[B, 10]; only for a model trained with `--labels N`."""
        return self.classifier(images, train=train)

    def init_semi_supervised(self, images, labels, z_key):
        """Touch every part (the VAE and q(y|x)) so `init` creates all their parameters."""
        return self(images, labels, z_key), self.classify(images)

    def prior_mixture(self):
        """A learned p(z | y) as a diagonal mixture (log_weights f32[10, K], means, logvars
        f32[10, K, L]) from the current parameters; None for the other priors. After training
        it is written into the "prior" collection (`lever_losses.learned_prior_collection`),
        which `generate` and `log_prior` read as they read the fitted mixture."""
        if self.config.prior == "vamp":
            return learned_prior.vamp_components(self.encode, self.pseudo_inputs())
        if self.config.prior == "learned_mixture":
            return self.learned()
        return None

    def generate(self, noise: jax.Array, labels: jax.Array) -> jax.Array:
        """Pixel logits [B, 784] of samples: noise f32[B, L] ~ N(0, t^2 I) through the prior."""
        mixture = None if self.config.prior == "standard" else self.mixture.value
        z = prior_lib.draw(noise, labels, mixture=mixture, truncation=self.config.truncation)
        return self.decode(z, labels)

    def log_prior(self, z: jax.Array, labels: jax.Array) -> jax.Array:
        """log p(z | y): z f32[B, L], labels i32[B] -> f32[B]."""
        if self.config.prior == "standard":
            return -0.5 * jnp.sum(jnp.square(z) + prior_lib.LOG_2PI, axis=-1)
        return prior_lib.log_density(self.mixture.value, z, labels)

    def __call__(self, images: jax.Array, labels: jax.Array, z_key: jax.Array, *,
                 train: bool = False):
        """-> (pixel logits [B, 784], mean [B, L], logvar [B, L])."""
        mean, logvar = self.encode(images, labels, train=train)
        if self.is_initializing():  # a learned prior's parameters are created with the rest
            self.prior_mixture()
        z = reparameterize(z_key, mean, logvar)
        return self.decode(z, labels, train=train), mean, logvar


def prior_components(config: Config) -> int:
    """Components of each class's mixture: the pseudo-inputs of a VampPrior, else
    --prior-components."""
    return config.pseudo_inputs if config.prior == "vamp" else config.prior_components


def create_model(config: Config):
    """The module a config asks for: the one-latent `CVAE`, or with `stochastic_layers` > 1 the
    ladder VAE (cvae/model/hierarchical.py `LadderCVAE`, which answers the same `encode`,
    `decode`, `generate` and `has_classifier`)."""
    if config.stochastic_layers > 1:
        from cvae.model.hierarchical import create_ladder  # it imports this module

        return create_ladder(config)
    return CVAE(config)


def pixel_means(logits: jax.Array, sharpness: float = 1.0) -> jax.Array:
    """Decoder output -> pixel intensities in [0, 1]: the expected ones at sharpness 1.

    The same for both likelihoods: the Gaussian mean is sigmoid-squashed too. Every image shown
    renders at the config's `pixel_sharpness` (for the Bernoulli decoder, its means at
    temperature 1/s: a sample's mean blurs over the decoder's doubt; docs/training.md).
    """
    return jax.nn.sigmoid(sharpness * logits)


def init_variables(model: CVAE, key: jax.Array) -> dict:
    """Parameters (and batch_stats when BatchNorm is on) for a batch of one."""
    if not isinstance(model, CVAE):  # the ladder VAE (`create_model`)
        from cvae.model.hierarchical import init_ladder

        return init_ladder(model, key)
    params_key, z_key, dropout_key = jax.random.split(key, 3)
    images = jnp.zeros((1, IMAGE_PIXELS), jnp.float32)
    labels = jnp.zeros((1,), jnp.int32)
    rngs = {"params": params_key, "dropout": dropout_key}
    if not model.has_classifier:
        return model.init(rngs, images, labels, z_key)
    return model.init(rngs, images, labels, z_key, method=CVAE.init_semi_supervised)
