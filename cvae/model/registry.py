"""Building the run's model family: the family the config's `model` section names
(`cvae.config.components` knows which families exist), shaped for the run's dataset.

Each family is a `cvae.model.interface.Family` with its own `Options` and `widths(options, data)`
(its noise and code widths, read without building it), as big_vision's model modules export
`Model`.
"""

from __future__ import annotations

from cvae.data.specs import spec_of


def noise_dim(config) -> int:
    """The width of one sample's noise N(0, t^2 I)."""
    return config.model.component.widths(config.model.options,
                                         spec_of(config.data.dataset))[0]


def code_dim(config) -> int:
    """The width of a code: what `encode` gives and `decode` takes."""
    return config.model.component.widths(config.model.options,
                                         spec_of(config.data.dataset))[1]


def param_groups(config) -> dict[str, tuple[str, ...]]:
    """Top-level parameter modules by role ("encoder", "decoder"): what `--freeze` holds."""
    return config.model.component.PARAM_GROUPS


def create_model(config, data=None):
    """The family the config names, shaped for `data` (default: the config's dataset): it
    gets its own options, the data's shape and the parts of the run it is made of (the prior,
    the likelihood, the truncation, whether it learns q(y|x)), not the whole config."""
    return config.model.component(
        options=config.model.options, data=data or spec_of(config.data.dataset),
        prior_config=config.prior, likelihood=config.likelihood,
        truncation=config.drawing.truncation, labelled=config.labels.labelled_count)


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
