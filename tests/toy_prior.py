"""A prior that exists only in the tests, with two options of its own: a per-class mixture of
`toy_components` Gaussians fitted to the posterior means (`toy_codes`) after each evaluated
epoch. `tests/test_model_family.py` registers it as "toy_prior" beside the test-only family.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from cvae.config.settings import setting
from cvae.model import prior as prior_lib
from cvae.model.priors import FittedMixture


@dataclasses.dataclass(frozen=True)
class Options:
    toy_components: int = setting(2, "The toy prior's components a class.", low=1)
    toy_codes: Literal["samples", "means"] = setting(
        "means", "What the toy prior is fitted to.")


class ToyPrior(FittedMixture):
    """A test-only prior: a small mixture fitted to the posterior means."""

    Options = Options

    @staticmethod
    def components(options) -> int:
        return options.toy_components

    @staticmethod
    def fit(encode_fn, *, options, binarized: bool):
        return prior_lib.create_fit_fn(encode_fn, components=options.toy_components,
                                       codes=options.toy_codes, binarized=binarized)
