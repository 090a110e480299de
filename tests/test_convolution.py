"""The convolutions of cvae/model/convolution.py: the convnet's (flax's values and parameters, a
backward pass of matrix products, a Bayes reading whose memory one label bounds) and the
hierarchical family's 3x3 (a Dense over the windows' parameters and values, and no kernel
gradient left to a convolution)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae.model import convolution, hierarchical
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


def all_equations(jaxpr) -> list:
    """Every equation of a jaxpr and of its sub-jaxprs (the custom rules')."""
    found = []
    for equation in jaxpr.eqns:
        found.append(equation)
        for value in equation.params.values():
            for inner in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    found += all_equations(inner)
    return found


def gradient_step(config, batch: int):
    """(the jaxpr of the gradient of a batch's log p(x|z, y), the model's variables)."""
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    images, labels = jnp.zeros((batch, 784)), jnp.arange(batch)
    noise = jax.random.normal(jax.random.key(1), (1, batch, model.noise_dim))

    def loss(params):
        terms = model.apply({**variables, "params": params}, images, labels, noise,
                            method="terms")
        return jnp.sum(terms.log_px)

    return jax.make_jaxpr(jax.grad(loss))(variables["params"]).jaxpr, variables


def test_the_backward_pass_has_no_convolution():
    """What makes a conv step fast in the training loop (module docstring): a gradient step
    runs the forward convolutions and nothing else of the kind."""
    jaxpr, _ = gradient_step(test_config().replace(architecture="conv", hidden_sizes=(16,)), 4)
    primitives = [equation.primitive.name for equation in all_equations(jaxpr)]
    assert primitives.count("conv_general_dilated") == 4  # 2 encoder, 2 decoder
    assert "dot_general" in primitives


def test_a_conv_models_bayes_reading_of_1024_digits_fits_in_memory():
    """Ten labels x 16 draws x 1,024 digits through the conv decoder at once would need
    about 6 GB of scratch; a label at a time needs a tenth."""
    config = test_config().replace(architecture="conv", hidden_sizes=(16,))
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    compiled = create_classify_fn(model).lower(variables, jnp.zeros((1024, 784))).compile()
    assert compiled.memory_analysis().temp_size_in_bytes < 2**30


@pytest.mark.parametrize("shape, features", [((3, 28, 28, 8), 8), ((2, 7, 7, 16), 4),
                                             ((2, 5, 9, 3), 6)])
def test_a_3x3_convolution_is_a_dense_over_its_windows(shape, features):
    """The same parameters, initial values, outputs and gradients (to rounding) as the Dense
    over the windows it replaced, so checkpoints of either load into the other."""
    x = jax.random.normal(jax.random.key(0), shape)
    dense = nn.Dense(features)
    ours = convolution.Conv3x3(features).apply
    theirs = lambda v, x: dense.apply(v, convolution._same_patches(x))  # noqa: E731
    initial = convolution.Conv3x3(features).init(jax.random.key(1), x)
    windows = convolution._same_patches(x)
    assert jax.tree.all(jax.tree.map(np.array_equal, initial,
                                     dense.init(jax.random.key(1), windows)))
    variables = perturbed(initial)
    np.testing.assert_allclose(ours(variables, x), theirs(variables, x), rtol=1e-5, atol=1e-5)

    def gradients(layer):
        loss = lambda v, x: jnp.sum(jnp.sin(layer(v, x)))  # noqa: E731
        return jax.jit(jax.grad(loss, argnums=(0, 1)))(variables, x)

    for mine, dense_s in zip(jax.tree.leaves(gradients(ours)), jax.tree.leaves(gradients(theirs))):
        np.testing.assert_allclose(mine, dense_s, rtol=1e-5, atol=1e-5 * np.abs(dense_s).max())


def test_the_hierarchical_step_runs_forward_convolutions_only():
    """Every convolution in the family's gradient step is a forward one, stride 1, in the
    layout of the forward pass: two a 3x3 layer (its output and its input's gradient), none
    for a kernel's gradient (a matrix product instead), and the cells keep the Dense names
    their parameters had."""
    jaxpr, variables = gradient_step(test_config().replace(
        model="hierarchical", width=8, depths=(1, 1), latent_channels=2), 2)
    convolutions = [equation for equation in all_equations(jaxpr)
                    if equation.primitive.name == "conv_general_dilated"]
    cells = [name for name in variables["params"] if name.startswith(("encoder", "decoder"))]
    assert len(convolutions) == 2 * 2 * len(cells)
    forward = convolutions[0].params["dimension_numbers"]
    assert all(eq.params["dimension_numbers"] == forward
               and eq.params["window_strides"] == (1, 1) for eq in convolutions)
    cell = variables["params"][cells[0]]
    assert sorted(cell) == list(hierarchical.LAYER_NAMES)
    assert cell["Dense_2"]["kernel"].shape == (9 * 8, 8)

