"""The model families by name: the one place that knows which families exist.

`Config.model` names a family; `create_model(config)` builds it for the run's dataset
(`cvae.data.specs`). Each family is a module that exports `Model` (a `cvae.model.interface.Family`)
and `noise_dim(config)`, `code_dim(config)` (its widths, read without building it), as
big_vision's model modules export `Model`. A new family is one module and one line here, or
`register(name, module)` at run time; `CVAE_MODEL_FAMILIES="name=package.module,..."` registers
families in every process that reads it (the service's workers, `cvae` subprocesses).
No JAX is imported until a family is built, so the config validates names without it.
"""

from __future__ import annotations

import importlib
import os

FAMILIES: dict[str, str] = {"cvae": "cvae.model.one_latent", "ladder": "cvae.model.ladder"}
ENV_FAMILIES = "CVAE_MODEL_FAMILIES"


def register(name: str, module: str) -> None:
    """Make family `name` (module path `module`, exporting `Model`) available by name."""
    FAMILIES[name] = module


def _register_from_environment() -> None:
    for entry in os.environ.get(ENV_FAMILIES, "").split(","):
        name, _, module = (part.strip() for part in entry.partition("="))
        if name:  # a blank entry (a trailing comma and space) names no family
            register(name, module)


def names() -> tuple[str, ...]:
    _register_from_environment()
    return tuple(FAMILIES)


def family_module(name: str):
    """The module of family `name`; ValueError naming the known ones otherwise."""
    if name not in names():
        raise ValueError(f"unknown model {name!r}; known: {', '.join(FAMILIES)}")
    return importlib.import_module(FAMILIES[name])


def noise_dim(config) -> int:
    """The width of one sample's noise N(0, t^2 I)."""
    return family_module(config.model).noise_dim(config)


def code_dim(config) -> int:
    """The width of a code: what `encode` gives and `decode` takes."""
    return family_module(config.model).code_dim(config)


def param_groups(config) -> dict[str, tuple[str, ...]]:
    """Top-level parameter modules by role ("encoder", "decoder"): what `--freeze` holds."""
    return family_module(config.model).Model.PARAM_GROUPS


def create_model(config, data=None):
    """The family `config.model` names, shaped for `data` (default: the config's dataset)."""
    from cvae.data.specs import spec_of

    return family_module(config.model).Model(config, data or spec_of(config.dataset))


def init_variables(model, key):
    """Parameters (and batch_stats with BatchNorm, the prior collection where the run has
    one) for a batch of one."""
    import jax
    import jax.numpy as jnp

    params_key, _, dropout_key = jax.random.split(key, 3)  # the middle key: no longer used
    # Abstract inputs (flax's lazy_init): each initializer runs op by op as under `init`, the
    # same programs and bits, but the forward pass through the batch of one (dots, activations,
    # the loss terms) is only traced, not compiled and run one op at a time: 1.6 CPU-s less
    # with a cold compilation cache. (Under jax.jit the VampPrior's initial values differ.)
    images = jax.ShapeDtypeStruct((1, model.data.pixels), jnp.float32)
    labels = jax.ShapeDtypeStruct((1,), jnp.int32)
    noise = jax.ShapeDtypeStruct((1, model.noise_dim), jnp.float32)
    return model.lazy_init({"params": params_key, "dropout": dropout_key}, images, labels, noise,
                           method="initialize")
