"""What an exported folder computes: the sampler's functions with the weights inside.

    sample(noise f32[B, D], label i32[B]) -> images f32[B, h, w] in [0, 1]
        the prior mapping and the decoder: what `/sample` decodes for noise ~ N(0, t^2 I);
        D is the sampler's `noise_dim` (a ladder's: every layer, top layer first)
    encode(images f32[B, h*w] in [0, 1], label i32[B])
        -> mean f32[B, L], logvar f32[B, L], neg_elbo f32[B]   (the posterior q(z|x,y) of
        a code: a ladder's top layer)
    classify(images f32[B, h*w] in [0, 1]) -> probabilities f32[B, classes]
        q(y|x), only for a model trained with `--labels N`

h, w and classes are the model's dataset's (`Config.spec`; MNIST: 28, 28 and 10).

For StableHLO they are the sampler's own jitted programs (`cvae.sampling.sampler`) applied to
the weights behind an optimization barrier: XLA then compiles them as it compiles the sampler's
(weights as values it cannot fold), so they give the sampler's bits; folded as constants, the
dots rounded differently (1 ulp). For ONNX, the mixture prior's component choice is written
with `floor` instead of `mod` (jax2onnx 0.17.1 cannot convert `rem` with a symbolic batch
size): the same bits, see `onnx_prior_sample`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

import jax
import jax.numpy as jnp

from cvae.model import prior as prior_lib
from cvae.model.densities import pixel_means
from cvae.model.registry import create_model
from cvae.data.specs import spec_of


@dataclasses.dataclass(frozen=True)
class Portable:
    """One exported function: fn(*inputs) with the weights inside."""

    name: str
    fn: Callable
    inputs: tuple[tuple[str, tuple[int, ...], str], ...]  # (name, shape after B, dtype)
    outputs: tuple[str, ...]


def signatures(sampler) -> dict[str, tuple]:
    """name -> (inputs, outputs) for the functions this model has."""
    noise, pixels = sampler.noise_dim, spec_of(sampler.config.data.dataset).pixels
    found = {"sample": ((("noise", (noise,), "float32"), ("label", (), "int32")), ("images",)),
             "encode": ((("images", (pixels,), "float32"), ("label", (), "int32")),
                        ("mean", "logvar", "neg_elbo"))}
    if sampler.has_classifier:
        found["classify"] = ((("images", (pixels,), "float32"),), ("probabilities",))
    return found


def used_variables(variables: dict, name: str, config) -> dict:
    """`variables` cut down to what function `name` reads: the top-level modules the family
    lists for it (`EXPORT_MODULES`; list modules count by their name less the index), and the
    prior collection for `sample` only. A file holds no weights it does not use."""
    reads = config.model.component.EXPORT_MODULES[name]
    kept = {collection: {module: tree for module, tree in modules.items()
                         if re.sub(r"_\d+$", "", module) in reads}
            for collection, modules in variables.items() if collection != prior_lib.COLLECTION}
    if name == "sample" and prior_lib.COLLECTION in variables:
        kept[prior_lib.COLLECTION] = variables[prior_lib.COLLECTION]
    return {collection: modules for collection, modules in kept.items() if modules}


def exact_functions(sampler) -> list[Portable]:
    """The sampler's programs on its weights, for `jax.export` (bit for bit, see above)."""
    def held(fn, name):
        variables = used_variables(sampler.variables, name, sampler.config)
        return lambda *args: fn(jax.lax.optimization_barrier(variables), *args)

    fns = {"sample": held(sampler.decode_fn, "sample"),
           "encode": held(sampler.encode_fn, "encode"),
           "classify": held(sampler.classify_fn, "classify") if sampler.has_classifier else None}
    return [Portable(name, fns[name], *signature)
            for name, signature in signatures(sampler).items()]


def onnx_functions(sampler) -> list[Portable]:
    """The same functions traced for jax2onnx (no barrier; the prior via `floor`)."""
    variables, config = sampler.variables, sampler.config
    model = create_model(config)

    def sample(noise, labels):
        logits = model.apply(variables, noise, labels, onnx_prior_sample, method="generate")
        spec = spec_of(config.data.dataset)
        return pixel_means(logits, config.drawing.pixel_sharpness, likelihood=config.likelihood,
                           channels=spec.channels).reshape(-1, *spec.stored_shape)

    fns = {"sample": sample,
           "encode": lambda images, labels: sampler.encode_fn(variables, images, labels),
           "classify": (lambda images: sampler.classify_fn(variables, images))
           if sampler.has_classifier else None}
    return [Portable(name, fns[name], *signature)
            for name, signature in signatures(sampler).items()]


def onnx_prior_sample(prior: dict, noise: jax.Array, labels: jax.Array, *,
                      radius: float | None = None) -> jax.Array:
    """`cvae.model.prior.sample`, written with ops jax2onnx converts with a symbolic batch.

    frac(a) as `a - floor(a)` instead of `mod(a, 1)`: both are the one correctly rounded value
    of the same real number (fmod is exact, and so is a - trunc(a); for a < 0, mod adds 1 to
    it in one rounding, as a - floor(a) rounds a - trunc(a) + 1 once), up to the sign of a
    zero, which no `>=` against the positive edges can tell apart. The component's mean and
    factor are gathered from flattened [classes * components] tables (jax2onnx mis-shapes the
    vmapped per-row gather). tests/test_export_functions.py checks the bits against the
    original.
    """
    classes, components = prior["weights"].shape
    weights = prior["weights"][labels]
    scaled = noise[:, 0] * prior_lib._COMPONENT_SCALE
    uniform = scaled - jnp.floor(scaled)
    edges = jnp.cumsum(weights, axis=-1)
    component = jnp.minimum(jnp.sum(uniform[:, None] >= edges, axis=-1),
                            prior_lib.last_drawn(weights))
    row = labels * components + component.astype(labels.dtype)
    means = prior["means"].reshape(classes * components, -1)[row]
    tril = prior["scale_tril"].reshape(classes * components, *prior["scale_tril"].shape[2:])[row]
    return means + jnp.einsum("bij,bj->bi", tril, prior_lib.truncate(noise, radius))

