"""The priors p(z|y) over the codes, registered by name (`cvae.config.components`), each a class
with its own options and one interface, so no caller asks which prior it holds:

- `draws_from_mixture`: samples, bounds and Bayes' rule read a per-class Gaussian mixture kept
  in the checkpoint's "prior" collection (`cvae.model.prior`); without one, N(0, I);
- `components(options)`: that mixture's components a class;
- `fit(encode, likelihood, options)`: where the mixture is fitted to the codes after each
  evaluated epoch, the fit (`cvae.model.prior.create_fit_fn`); None otherwise;
- `learned_module(...)`: where the prior is learnt with the model, its Linen module (the family
  holds it as `module_name`, which names its parameters in a checkpoint), and
  `learned_mixture(family)` it as a diagonal mixture at the current parameters: training's KL
  is taken against it and the "prior" collection holds it as it stands.

Training's KL of the others is against N(0, I) (`Family.log_prior`).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from cvae.config.settings import NoOptions, setting
from cvae.model import learned_prior
from cvae.model import prior as prior_lib


class Prior:
    """N(0, I) and nothing stored: the interface's defaults."""

    Options = NoOptions
    draws_from_mixture = False
    learned = False
    module_name = ""

    @staticmethod
    def components(options) -> int:
        return 0

    @staticmethod
    def fit(encode_fn, *, options, binarized: bool):
        return None

    @staticmethod
    def learned_module(options, *, code_dim: int, pixels: int, num_classes: int,
                       logvar_bound: float):
        return None

    @staticmethod
    def learned_mixture(family):
        return None


class Standard(Prior):
    """N(0, I) for every class, for training and sampling alike."""


@dataclasses.dataclass(frozen=True)
class MixtureOptions:
    components: int = setting(30, "Components of each class's mixture prior.", low=1)
    codes: Literal["samples", "means"] = setting(
        "samples", "What the mixture is fitted to: a draw from q(z|x,y) per training image (the "
                   "aggregate posterior: wider samples), or its mean (tighter: more typical).")


class FittedMixture(Prior):
    """A per-class Gaussian mixture fitted to the codes after each evaluated epoch, for
    sampling and evaluation only (training's KL uses N(0, I))."""

    Options = MixtureOptions
    draws_from_mixture = True

    @staticmethod
    def components(options) -> int:
        return options.components

    @staticmethod
    def fit(encode_fn, *, options, binarized: bool):
        return prior_lib.create_fit_fn(encode_fn, components=options.components,
                                       codes=options.codes, binarized=binarized)


@dataclasses.dataclass(frozen=True)
class VampOptions:
    pseudo_inputs: int = setting(
        50, "Pseudo-inputs per class; p(z|y) is the mean of q(z|u,y) over them (Tomczak and "
            "Welling 2018).", low=1)


class VampPrior(Prior):
    """A VampPrior, learnt with the model: the mean of the encoder's posteriors at learnt
    pseudo-inputs of each class."""

    Options = VampOptions
    draws_from_mixture = True
    learned = True
    module_name = "pseudo_inputs"

    @staticmethod
    def components(options) -> int:
        return options.pseudo_inputs

    @staticmethod
    def learned_module(options, *, code_dim: int, pixels: int, num_classes: int,
                       logvar_bound: float):
        return learned_prior.PseudoInputs(options.pseudo_inputs, pixels, num_classes)

    @staticmethod
    def learned_mixture(family):
        return learned_prior.vamp_components(family.encode, family.pseudo_inputs())


@dataclasses.dataclass(frozen=True)
class LearnedMixtureOptions:
    components: int = setting(30, "Components of each class's learnt mixture.", low=1)


class LearnedMixture(Prior):
    """A per-class diagonal Gaussian mixture learnt with the model."""

    Options = LearnedMixtureOptions
    draws_from_mixture = True
    learned = True
    module_name = "learned"

    @staticmethod
    def components(options) -> int:
        return options.components

    @staticmethod
    def learned_module(options, *, code_dim: int, pixels: int, num_classes: int,
                       logvar_bound: float):
        return learned_prior.GaussianMixturePrior(options.components, code_dim, num_classes,
                                                  logvar_bound=logvar_bound)

    @staticmethod
    def learned_mixture(family):
        return family.learned()
