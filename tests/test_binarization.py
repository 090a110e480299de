"""Dynamic binarisation: x ~ Bernoulli(intensity), and only where the run models binary pixels."""

import jax
import jax.numpy as jnp
import numpy as np

from cvae.config import presets
from cvae.model.binarization import binarize, maybe_binarize


def test_binarize_draws_ones_with_the_intensity_as_probability():
    intensities = jnp.tile(jnp.asarray([0.0, 0.25, 0.9, 1.0], jnp.float32), (20000, 1))
    x = np.asarray(binarize(jax.random.key(0), intensities))
    assert x.dtype == np.float32 and set(np.unique(x)) <= {0.0, 1.0}
    np.testing.assert_allclose(x.mean(axis=0), [0.0, 0.25, 0.9, 1.0], atol=0.01)
    assert not np.array_equal(x, np.asarray(binarize(jax.random.key(1), intensities)))


def test_maybe_binarize_leaves_gaussian_and_undynamic_runs_alone():
    images = jnp.full((2, 3), 0.5, jnp.float32)
    key = jax.random.key(0)
    config = presets.test()
    assert np.array_equal(maybe_binarize(key, images, config), binarize(key, images))
    for other in (config.replace(likelihood="gaussian"), config.replace(binarization="none")):
        assert maybe_binarize(key, images, other) is images
