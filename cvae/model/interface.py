"""What every model family answers, so that no caller asks which family it holds.

A family is a Flax Linen module built from its own options, its dataset's spec
(`cvae.data.specs`) and the parts of the run it is made of (the prior's and the likelihood's
sections, the truncation, the labelled count), never the whole config
(`cvae.model.registry.create_model`), and registered by name (`cvae.config.components`). It
answers:

- `noise_dim`, `code_dim`: the width of one sample's N(0, t^2 I) noise, and of a code (what
  `encode` gives and `decode` takes: the posterior the transfer, walks and prior fit work on);
- `initialize(images, labels, noise)`: touches every part, so `init` creates every parameter;
- `encode(images, labels)` -> the code's posterior (mean, logvar);
- `decode(codes, labels)`, `decode_onehot(codes, onehot)` -> pixel logits;
- `generate(noise, labels, sample_fn)` -> pixel logits of samples drawn through the prior;
- `terms(images, labels, noise, train, sampling_prior)` -> `Terms` of K reparameterised draws
  from the given unit-normal noise f32[K, B, noise_dim]; `score(images, labels, z, ...)` the
  same for given draws z (DReG evaluates fixed draws with it); `draws(images, labels, noise)`
  the draws z themselves, f32[K, B, noise_dim];
- `reconstruct(images, labels)` -> (code mean, code logvar, -ELBO at the posterior means,
  its KL in closed form, through `objectives.negative_elbo`);
- `classify(images)` -> q(y | x)'s logits, where the run learns one (`--labels N`).

Every objective (cvae/model/objectives.py) is written on `Terms` alone. The prior p(z | y) over
the codes is shared code: the base class `Family` below holds it once (module docstrings of
cvae/model/prior.py and cvae/model/learned_prior.py say what each prior is).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from cvae.config.components import LikelihoodSection, PriorSection
from cvae.data.specs import DatasetSpec
from cvae.model import densities, learned_prior
from cvae.model import prior as prior_lib
from cvae.model.layers import Classifier

class Terms(NamedTuple):
    """Per-draw terms of one pass, f32[K, B] unless said otherwise.

    log w = log_px + log_pz - log_qz is the importance log weight. The KL of the ELBO is
    kl_dims summed (the dimensions whose KL the family has in closed form, f32[K, B, Da]) plus
    kl_rest (the other dimensions' KL as the draw estimates it, log q - log p): the same
    expectation as log_qz - log_pz, with less variance where a closed form exists.
    """

    log_px: jax.Array  # log p(x | z, y)
    log_pz: jax.Array  # log p(z | y)
    log_qz: jax.Array  # log q(z | x, y)
    kl_dims: jax.Array
    kl_rest: jax.Array


def sampled_terms(log_px, log_pz, log_qz) -> Terms:
    """Terms with no closed-form KL: the whole KL is the draw's estimate."""
    return Terms(log_px, log_pz, log_qz, jnp.zeros(log_px.shape + (0,), log_px.dtype),
                 log_qz - log_pz)


class Family(nn.Module):
    """The base of every family: the fields, the label's one-hot, the prior and q(y|x)."""

    options: Any  # the family's own `Options`
    data: DatasetSpec  # the images' shape and classes
    prior_config: PriorSection  # the prior over codes: its name and options
    likelihood: LikelihoodSection  # p(x|z,y): its name and options
    truncation: float  # where samples' noise is pulled in (`drawing.truncation`)
    labelled: int | None  # how many training images keep their labels; None: all

    # Which top-level modules each exported function reads (`cvae export` keeps only those),
    # and which ones `--freeze encoder|decoder` holds fixed. Each family sets its own.
    EXPORT_MODULES: ClassVar[dict] = {}
    PARAM_GROUPS: ClassVar[dict] = {}

    @staticmethod
    def widths(options, data: DatasetSpec) -> tuple[int, int]:
        """(the noise's width, a code's width) for these options and images of `data`'s
        shape, without building the model: each family says its own."""
        raise NotImplementedError

    @staticmethod
    def keeps_batch_stats(options) -> bool:
        """Whether these options give the model BatchNorm statistics (a checkpoint keeps
        them beside the weights)."""
        return getattr(options, "batch_norm", False)

    @property
    def noise_dim(self) -> int:
        return self.widths(self.options, self.data)[0]

    @property
    def code_dim(self) -> int:
        return self.widths(self.options, self.data)[1]

    @property
    def num_classes(self) -> int:
        return self.data.num_classes

    @property
    def has_classifier(self) -> bool:
        """Whether the model learns q(y|x): trained with few labels (`--labels N`)."""
        return self.labelled is not None

    def onehot(self, labels: jax.Array) -> jax.Array:
        return jax.nn.one_hot(labels, self.num_classes)

    def decode(self, codes: jax.Array, labels: jax.Array, *, train: bool = False) -> jax.Array:
        return self.decode_onehot(codes, self.onehot(labels), train=train)

    # -- the prior over codes, shared by every family --------------------------------------

    @property
    def prior(self):
        """The run's prior (`cvae.model.priors`)."""
        return self.prior_config.component

    def setup_prior(self, code_dim: int, *, logvar_bound: float = 8.0) -> None:
        """Declares the prior's variables on this module (call from `setup`): the "prior"
        collection's mixture, where the run has one, and a learned prior's parameters (its
        log-variances soft-clamped as the family clamps its own)."""
        options, prior = self.prior_config.options, self.prior
        where = (prior_lib.COLLECTION, prior_lib.VARIABLE)
        if prior.draws_from_mixture and (self.is_initializing() or self.has_variable(*where)):
            self.mixture = self.variable(*where, prior_lib.standard_mixture, self.num_classes,
                                         prior.components(options), code_dim)
        learned = prior.learned_module(options, code_dim=code_dim,
                                       pixels=self.data.pixels, num_classes=self.num_classes,
                                       logvar_bound=logvar_bound)
        if learned is not None:
            setattr(self, prior.module_name, learned)
        if self.has_classifier:
            self.classifier = self.make_classifier()

    def make_classifier(self) -> nn.Module:
        """q(y|x)'s network, for a model trained with few labels: by default an MLP of the
        encoder's widths (`cvae.model.layers.Classifier`); a family may bring its own."""
        return Classifier(self.options, self.data)

    def prior_mixture(self):
        """A learned prior as a diagonal mixture (log_weights f32[C, K], means, logvars
        f32[C, K, L]) at the current parameters; None for the other priors."""
        return self.prior.learned_mixture(self)

    def log_prior(self, z: jax.Array, labels: jax.Array, *, sampling: bool) -> jax.Array:
        """log p(z_code | y): z f32[..., B, L], labels i32[B] -> f32[..., B].

        sampling=False: the prior training's KL is taken against (N(0, I), or a learned
        prior at the current parameters). sampling=True: the prior samples are drawn from
        (the "prior" collection's mixture where the model has one), which `cvae eval`'s
        bounds and Bayes' rule score under.
        """
        if sampling and self.prior.draws_from_mixture and hasattr(self, "mixture"):
            return prior_lib.log_density_batched(self.mixture.value, z, labels)
        if self.prior.learned:
            return learned_prior.diagonal_log_density(self.prior_mixture(), z, labels)
        return densities.standard_log_density(z)

    def draw_codes(self, noise: jax.Array, labels: jax.Array,
                   sample_fn: Callable = prior_lib.sample) -> jax.Array:
        """Codes f32[B, L] from the code's share of the noise f32[B, L], through the prior
        samples come from and the config's truncation."""
        mixture = self.mixture.value if self.prior.draws_from_mixture else None
        return prior_lib.draw(noise, labels, mixture=mixture,
                              truncation=self.truncation, sample_fn=sample_fn)

    def classify(self, images: jax.Array, *, train: bool = False) -> jax.Array:
        """Logits of q(y | x), f32[B, classes]; only for a model trained with `--labels N`."""
        return self.classifier(images, train=train)

    def initialize(self, images: jax.Array, labels: jax.Array, noise: jax.Array):
        """Touch every part (the model, a learned prior, q(y|x)) so `init` creates them all."""
        out = self.terms(images, labels, noise[None])
        extra = (self.prior_mixture(),)
        if self.has_classifier:
            extra += (self.classify(images),)
        return out, extra
