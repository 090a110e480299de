"""Bayes-rule reading through each model's own log weights (cvae/model/log_weights.py): the
probabilities of the ten labels, a row's reading independent of its neighbours, for the CVAE
and the ladder."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae import presets
from cvae.model import hierarchical as hv
from cvae.model import objectives as obj
from cvae.model.log_weights import create_bayes_classify_fn, log_weights_fn, noise_width
from cvae.model.registry import create_model, init_variables


def models():
    config = presets.test()
    cvae = create_model(config)
    ladder = hv.create_ladder(config.replace(stochastic_layers=2, upper_latent_dim=3))
    return [(cvae, init_variables(cvae, jax.random.key(0))),
            (ladder, hv.init_ladder(ladder, jax.random.key(0)))]


@pytest.mark.parametrize("index", [0, 1], ids=["cvae", "ladder"])
def test_bayes_rule_reads_each_row_alone_and_normalises(index):
    model, variables = models()[index]
    x = jax.random.uniform(jax.random.key(1), (5, 784))
    classify = create_bayes_classify_fn(model, num_samples=4)
    together = np.asarray(classify(variables, x))
    np.testing.assert_allclose(together.sum(axis=1), 1.0, rtol=1e-5)
    alone = np.asarray(classify(variables, x[2:3]))
    # (to float rounding across batch shapes: the sampler's fixed blocks make it exact)
    np.testing.assert_allclose(alone[0], together[2], rtol=1e-4, atol=1e-5)
    # The same as the per-label bounds of the model's own log weights.
    noise = jnp.broadcast_to(jax.random.normal(jax.random.key(0), (4, 1, noise_width(model))),
                             (4, 5, noise_width(model)))
    bounds = obj.per_label_bounds(log_weights_fn(model, variables, "bernoulli"), x, noise)
    np.testing.assert_allclose(together, jax.nn.softmax(bounds, axis=-1), rtol=1e-4, atol=1e-6)
