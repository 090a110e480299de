"""A pixel's scale: one uint8 -> [0, 1] conversion, whose last bit depends on where it runs
(pinned here, so a caller moved between host and device shows). Image shapes are the dataset
spec's (tests/test_specs.py)."""

import jax
import jax.numpy as jnp
import numpy as np

from cvae.data import pixels
from cvae.data.pixels import MAX_LEVEL, to_unit


def test_no_image_geometry_is_kept_here():
    """Shapes are the dataset spec's (`cvae.data.specs`), not constants of this module."""
    assert not [name for name in vars(pixels) if name.startswith("IMAGE_")]


def test_numpy_divides_by_255_and_xla_multiplies_by_its_reciprocal():
    levels = np.arange(MAX_LEVEL + 1, dtype=np.uint8)
    as_float = levels.astype(np.float32)
    in_numpy = to_unit(levels)
    in_jit = np.asarray(jax.jit(to_unit)(jnp.asarray(levels)))
    eager = np.asarray(to_unit(jnp.asarray(levels)))
    assert in_numpy.dtype == in_jit.dtype == np.float32
    assert in_numpy[0] == in_jit[0] == 0.0 and in_numpy[-1] == in_jit[-1] == 1.0
    assert np.array_equal(in_numpy, as_float / np.float32(255))
    if jax.default_backend() == "cpu":  # XLA's CPU compiler; other backends may round alike
        assert np.array_equal(in_jit, as_float * np.float32(1 / 255))
    assert np.array_equal(eager, in_jit)
    assert np.abs(in_numpy - in_jit).max() <= np.spacing(np.float32(1))
