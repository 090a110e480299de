"""The convnet's convolutions (cvae/model/convolution.py): flax's values and parameters, a
backward pass of matrix products, and a Bayes reading whose memory one label bounds."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae.model import convolution
from cvae.model.registry import create_model, init_variables
from cvae.config.presets import test as test_config
from cvae.sampling.functions import create_classify_fn

# (flax's layer, ours, an input shape): the encoder's and the decoder's, and an odd size.
PAIRS = [
    (nn.Conv(32, (3, 3), strides=2), convolution.Conv(32), (3, 28, 28, 1)),
    (nn.Conv(64, (3, 3), strides=2), convolution.Conv(64), (3, 14, 14, 32)),
    (nn.Conv(8, (3, 3), strides=2), convolution.Conv(8), (3, 7, 7, 3)),
    (nn.ConvTranspose(32, (3, 3), strides=(2, 2)), convolution.ConvTranspose(32), (3, 7, 7, 64)),
    (nn.ConvTranspose(1, (3, 3), strides=(2, 2)), convolution.ConvTranspose(1), (3, 14, 14, 32)),
]


def perturbed(variables):
    """Away from the initialisation (a zero bias would hide a misplaced one)."""
    leaves, tree = jax.tree.flatten(variables)
    keys = jax.random.split(jax.random.key(2), len(leaves))
    return jax.tree.unflatten(tree, [v + 0.1 * jax.random.normal(k, v.shape)
                                     for v, k in zip(leaves, keys)])


@pytest.mark.parametrize("theirs, ours, shape", PAIRS)
def test_the_same_parameters_and_forward_bits_as_flax(theirs, ours, shape):
    x = jax.random.normal(jax.random.key(0), shape)
    initial = theirs.init(jax.random.key(1), x)
    assert jax.tree.all(jax.tree.map(np.array_equal, initial, ours.init(jax.random.key(1), x)))
    variables = perturbed(initial)
    np.testing.assert_array_equal(jax.jit(ours.apply)(variables, x),
                                  jax.jit(theirs.apply)(variables, x))


@pytest.mark.parametrize("theirs, ours, shape", PAIRS)
def test_the_gradients_are_flax_s_to_rounding(theirs, ours, shape):
    x = jax.random.normal(jax.random.key(0), shape)
    variables = perturbed(theirs.init(jax.random.key(1), x))

    def gradients(layer):
        loss = lambda v, x: jnp.sum(jnp.sin(layer.apply(v, x)))  # noqa: E731
        return jax.jit(jax.grad(loss, argnums=(0, 1)))(variables, x)

    for mine, flax_s in zip(jax.tree.leaves(gradients(ours)), jax.tree.leaves(gradients(theirs))):
        np.testing.assert_allclose(mine, flax_s, rtol=1e-5, atol=1e-5 * np.abs(flax_s).max())


def primitives(jaxpr) -> list[str]:
    """Every primitive's name in a jaxpr, its sub-jaxprs (the custom rule's) included."""
    names = []
    for equation in jaxpr.eqns:
        names.append(equation.primitive.name)
        for value in equation.params.values():
            for inner in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    names += primitives(inner)
    return names


def test_the_backward_pass_has_no_convolution():
    """What makes a conv step fast in the training loop (module docstring): a gradient step
    runs the forward convolutions and nothing else of the kind."""
    config = test_config().replace(architecture="conv", hidden_sizes=(16,))
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    images, labels = jnp.zeros((4, 784)), jnp.arange(4)

    noise = jax.random.normal(jax.random.key(1), (1, 4, model.noise_dim))

    def loss(params):
        terms = model.apply({**variables, "params": params}, images, labels, noise,
                            method="terms")
        return jnp.sum(terms.log_px)

    step = jax.make_jaxpr(jax.grad(loss))(variables["params"])
    assert primitives(step.jaxpr).count("conv_general_dilated") == 4  # 2 encoder, 2 decoder
    assert "dot_general" in primitives(step.jaxpr)


def test_a_conv_models_bayes_reading_of_1024_digits_fits_in_memory():
    """Ten labels x 16 draws x 1,024 digits through the conv decoder at once would need
    about 6 GB of scratch; a label at a time needs a tenth."""
    config = test_config().replace(architecture="conv", hidden_sizes=(16,))
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    compiled = create_classify_fn(model).lower(variables, jnp.zeros((1024, 784))).compile()
    assert compiled.memory_analysis().temp_size_in_bytes < 2**30
