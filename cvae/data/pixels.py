"""A pixel's scale, stated once: uint8 levels 0..255 <-> float32 intensities in [0, 1].

Images are stored and passed around as uint8 levels, in the shape of their dataset's spec
(`cvae.data.specs.DatasetSpec.stored_shape`, which also gives the flattened width `pixels` the
model reads); the model reads float32 intensities in [0, 1]. NumPy only, so the data stage and
the grid code use it without JAX. `to_unit` takes JAX arrays too, jitted or not, but the bits
differ there: NumPy divides by 255, while XLA multiplies by float32(1 / 255), one unit in the
last place away for about half the levels. Each caller keeps the side it has always converted on
(the host for the sampler's blocks, the device in training), so no output moved.
"""

from __future__ import annotations

import numpy as np

MAX_LEVEL = 255  # the brightest uint8 level: intensity 1


def to_unit(levels):
    """uint8 levels (NumPy or JAX, any shape) -> float32 intensities level / 255 in [0, 1]
    (to the last bit in NumPy; XLA's rounding is the module docstring's)."""
    return levels.astype(np.float32) / np.float32(MAX_LEVEL)
