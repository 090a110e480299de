"""Pytree comparisons for tests."""

import jax
import numpy as np


def tree_equal(a, b) -> bool:
    """Same structure and bit-identical leaves."""
    a, b = jax.device_get(a), jax.device_get(b)
    if jax.tree.structure(a) != jax.tree.structure(b):
        return False
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
