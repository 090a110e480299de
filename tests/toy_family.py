"""A model family that exists only in the tests: one latent, a hidden layer each way, and two
options of its own (`toy_latent`, `toy_hidden`).

It proves that a family is one module plus its registry entry: `tests/test_model_family.py`
registers it as "toy" and runs it through the flags, `--print-config`, a TOML file, training,
resume, the run record, the service, `cvae eval` and `cvae export` (its card) without any of
them knowing it. It has no closed-form KL (its terms are all sampled), so it also exercises the
objectives' sampled-KL path.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from cvae.config.settings import setting
from cvae.model import densities, objectives
from cvae.model.interface import Family, Terms, sampled_terms


@dataclasses.dataclass(frozen=True)
class Options:
    toy_latent: int = setting(3, "The toy family's latent width.", low=1)
    toy_hidden: int = setting(8, "The toy family's hidden width, each way.", low=1)


class Toy(Family):
    """A test-only family: one latent, one hidden layer each way."""

    Options = Options
    EXPORT_MODULES = {"sample": ("hidden_out", "out"),
                      "encode": ("hidden_in", "into", "hidden_out", "out"),
                      "classify": ("classifier",)}
    PARAM_GROUPS = {"encoder": ("hidden_in", "into"), "decoder": ("hidden_out", "out")}

    def setup(self):
        options = self.options
        self.hidden_in = nn.Dense(options.toy_hidden)
        self.into = nn.Dense(2 * options.toy_latent)
        self.hidden_out = nn.Dense(options.toy_hidden)
        self.out = nn.Dense(self.data.pixels)
        self.setup_prior(options.toy_latent)

    @staticmethod
    def widths(options: Options, data) -> tuple[int, int]:
        return options.toy_latent, options.toy_latent

    def encode(self, images, labels, *, train: bool = False):
        h = nn.relu(self.hidden_in(jnp.concatenate([images, self.onehot(labels)], -1)))
        mean, raw = jnp.split(self.into(h), 2, axis=-1)
        return mean, 4.0 * jnp.tanh(raw / 4.0)

    def decode_onehot(self, codes, onehot, *, train: bool = False):
        return self.out(nn.relu(self.hidden_out(jnp.concatenate([codes, onehot], axis=-1))))

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
                                           self.likelihood,
                                           channels=self.data.channels)
        return sampled_terms(log_px, self.log_prior(z, labels, sampling=sampling_prior),
                             densities.gaussian_log_density(z, mean, logvar))

    def reconstruct(self, images, labels):
        mean, logvar = self.encode(images, labels)
        log_px = -densities.reconstruction(self.decode(mean, labels), images, self.likelihood,
                                           channels=self.data.channels)
        return mean, logvar, objectives.negative_elbo(
            log_px, densities.kl_per_dimension(mean, logvar), jnp.zeros_like(log_px))
