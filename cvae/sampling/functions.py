"""The sampler's jitted functions of (variables, inputs): decode, decode of codes, the prior's
mapping of noise to codes, encode and classify, built once per model and config in a process.

They are pure, so samplers of the same model share them (`sampler_functions`): a sampler for
another step of a run, or a service moving to a new checkpoint, runs the programs already
compiled for the first. cvae/sampling/sampler.py runs them in fixed blocks.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax

from cvae.config.sections import Config
from cvae.model import prior as prior_lib
from cvae.model.densities import pixel_means
from cvae.model.objectives import create_bayes_classify_fn
from cvae.model.registry import code_dim, noise_dim
from cvae.data.specs import spec_of


def create_decode_fn(model, config: Config, *, codes: bool = False) -> Callable:
    """Jitted `decode(variables, z f32[B, D], labels i32[B]) -> images in [0, 1]` (f32, the
    spec's `stored_shape`). z is the sampling noise, N(0, t^2 I), `noise_dim` wide; the
    model's prior maps it to its latent (the identity for the standard prior). With `codes`, z
    are codes (`code_dim` wide) decoded as they are: for the ladder, the top layer's, the
    layers below at their means.
    """
    method = "decode" if codes else "generate"
    spec = spec_of(config.data.dataset)
    shape = spec.stored_shape

    @jax.jit
    def decode(variables, z, labels):
        logits = model.apply(variables, z, labels, method=method)
        pixels = pixel_means(logits, config.drawing.pixel_sharpness,
                             likelihood=config.likelihood, channels=spec.channels)
        return pixels.reshape(-1, *shape)

    return decode


def create_prior_fn(model, config: Config) -> Callable | None:
    """Jitted `prior(variables, noise f32[B, D], labels i32[B]) -> codes f32[B, L]`: the code
    that `generate` decodes for that noise (the ladder's: its top layer's share, noise top layer
    first, through the prior and its truncation); None where it is the noise itself (one
    latent, standard prior, no truncation)."""
    width = code_dim(config)
    if (not config.prior.component.draws_from_mixture and width == noise_dim(config)
            and prior_lib.truncation_radius(config.drawing.truncation, width) is None):
        return None

    @jax.jit
    def prior(variables, noise, labels):
        return prior_lib.draw(noise[:, :width], labels,
                              mixture=prior_lib.mixture_of(config.prior.component, variables),
                              truncation=config.drawing.truncation)

    return prior


def create_encode_fn(model, config: Config) -> Callable:
    """Jitted `encode(variables, images f32[B, pixels] in [0, 1], labels i32[B])` ->
    (mean f32[B, L], logvar f32[B, L], neg_elbo f32[B]).

    mean, logvar: the code's posterior (the ladder's top layer). neg_elbo is -ELBO(x, y) at z =
    the posterior mean (every ladder layer's; reconstruction + KL, in nats):
    deterministic, and lowest for the label that explains the image best, which is how a
    transfer picks the label of an unlabelled digit.
    """

    @jax.jit
    def encode(variables, images, labels):
        return model.apply(variables, images, labels, method="reconstruct")

    return encode


def create_classify_fn(model) -> Callable | None:
    """Jitted `classify(variables, images f32[B, pixels] in [0, 1]) -> p(y|x) f32[B, classes]`
    (the model's dataset's; MNIST: 784 and 10): the classifier q(y|x) of a model trained with
    `--labels N`; for a model trained with every label, Bayes' rule on its own bounds on
    log p(x|y), every class in one call (a label at a time) with fixed draws
    (`cvae.model.objectives.create_bayes_classify_fn`)."""
    if not model.has_classifier:
        return create_bayes_classify_fn(model)

    @jax.jit
    def classify(variables, images):
        return jax.nn.softmax(model.apply(variables, images, method="classify"), axis=-1)

    return classify


@functools.lru_cache(maxsize=16)
def sampler_functions(model, config: Config) -> tuple[Callable | None, ...]:
    """(decode, code decode, prior, encode, classify), jitted, one set per model and config in a
    process: a sampler for another step of the same run (a service moving to a new checkpoint,
    a second `load_sampler`) reuses their compiled programs instead of tracing and compiling
    every block size again. Pure functions of (variables, inputs), so sharing them is safe."""
    prior_fn = create_prior_fn(model, config)
    code_decode_fn = None if prior_fn is None else create_decode_fn(model, config, codes=True)
    return (create_decode_fn(model, config), code_decode_fn, prior_fn,
            create_encode_fn(model, config), create_classify_fn(model))
