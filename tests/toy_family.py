"""A model family that exists only in the tests: one latent, one dense layer each way.

It proves that a family is one module plus its registry entry: `tests/test_model_family.py`
registers it as "toy" and runs it through training, resume, the service, `cvae eval` and
`cvae export` without any of them knowing it. It has no closed-form KL (its terms are all
sampled), so it also exercises the objectives' sampled-KL path.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from cvae.model import densities
from cvae.model.interface import Family, Terms, sampled_terms


class Toy(Family):
    EXPORT_MODULES = {"sample": ("out",), "encode": ("into", "out"), "classify": ("classifier",)}
    PARAM_GROUPS = {"encoder": ("into",), "decoder": ("out",)}

    def setup(self):
        self.into = nn.Dense(2 * self.config.latent_dim)
        self.out = nn.Dense(self.data.pixels)
        self.setup_prior(self.config.latent_dim)

    @property
    def noise_dim(self) -> int:
        return self.config.latent_dim

    @property
    def code_dim(self) -> int:
        return self.config.latent_dim

    def encode(self, images, labels, *, train: bool = False):
        mean, raw = jnp.split(self.into(jnp.concatenate([images, self.onehot(labels)], -1)), 2,
                              axis=-1)
        return mean, 4.0 * jnp.tanh(raw / 4.0)

    def decode_onehot(self, codes, onehot, *, train: bool = False):
        return self.out(jnp.concatenate([codes, onehot], axis=-1))

    def generate(self, noise, labels, sample_fn=None):
        codes = (self.draw_codes(noise, labels) if sample_fn is None
                 else self.draw_codes(noise, labels, sample_fn))
        return self.decode(codes, labels)

    def draws(self, images, labels, noise, *, train: bool = False):
        mean, logvar = self.encode(images, labels)
        return mean + jnp.exp(0.5 * logvar) * noise

    def terms(self, images, labels, noise, *, train: bool = False,
              sampling_prior: bool = False) -> Terms:
        return self.score(images, labels, self.draws(images, labels, noise),
                          sampling_prior=sampling_prior)

    def score(self, images, labels, z, *, train: bool = False,
              sampling_prior: bool = False) -> Terms:
        mean, logvar = self.encode(images, labels)
        logits = self.decode(z, jnp.broadcast_to(labels, z.shape[:-1]))
        log_px = -densities.reconstruction(logits, jnp.broadcast_to(images, logits.shape),
                                           self.config.likelihood)
        return sampled_terms(log_px, self.log_prior(z, labels, sampling=sampling_prior),
                             densities.gaussian_log_density(z, mean, logvar))

    def reconstruct(self, images, labels):
        mean, logvar = self.encode(images, labels)
        neg_elbo = densities.reconstruction(self.decode(mean, labels), images,
                                            self.config.likelihood)
        return mean, logvar, neg_elbo + densities.kl_per_dimension(mean, logvar).sum(-1)


def noise_dim(config) -> int:
    return config.latent_dim


def code_dim(config) -> int:
    return config.latent_dim


Model = Toy
