"""bench/lever_costs.py's candidates still trace: each lever's loss and its gradient, at the test
preset's sizes, against today's loss functions (the benchmark is only run by hand, so an API it
calls can change under it unnoticed). Traced with `jax.eval_shape`: no compile, no timing."""

import jax
import jax.numpy as jnp
import pytest

from bench import lever_costs
from cvae.config import presets

CONFIG = presets.test()
CANDIDATES = {**lever_costs.cvae_losses(CONFIG), **lever_costs.ladder_losses(CONFIG),
              **lever_costs.hierarchical_losses(CONFIG)}


@pytest.mark.parametrize("name", sorted(CANDIDATES))
def test_every_lever_loss_traces_to_a_scalar_with_a_gradient_for_each_parameter(name):
    init_fn, loss_fn = CANDIDATES[name]
    labels = jnp.arange(8, dtype=jnp.int32) % 10
    images = jnp.zeros((8, 784), jnp.float32)
    params = jax.eval_shape(init_fn, jax.random.key(0))
    loss, grads = jax.eval_shape(jax.value_and_grad(loss_fn), params, images, labels,
                                 jax.random.key(1))
    assert loss.shape == () and loss.dtype == jnp.float32
    assert jax.tree.structure(grads) == jax.tree.structure(params)
    assert jax.tree.map(lambda g: g.shape, grads) == jax.tree.map(lambda p: p.shape, params)
