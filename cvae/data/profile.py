"""What a data set's pixels are like, read once before a run picks its defaults
(`cvae.training.choices`): its shape, its size, and how nearly binary its grey levels are.

MNIST's digits are ink on paper: most pixels sit at the ends of the scale, few in between, so
a Bernoulli over binarised pixels models them; garments, faces and colour images have most of
their pixels in between, which only a density over the 256 levels models.
"""

from __future__ import annotations

import dataclasses

import numpy as np

# A pixel "in between" is more than this many levels from both ends of 0..255.
EDGE_LEVELS = 32
# The share of pixels a profile reads: every image's, up to this many images (evenly spaced).
SAMPLED_IMAGES = 2000


@dataclasses.dataclass(frozen=True)
class DataProfile:
    """A training set's shape, size and pixel statistics."""

    height: int
    width: int
    channels: int
    images: int
    classes: int
    between_share: float  # the share of pixel values more than EDGE_LEVELS from both ends
    grey_colour: bool  # a colour set whose channels are equal everywhere it was read

    @property
    def values(self) -> int:
        return self.height * self.width * self.channels


def profile(images: np.ndarray, labels: np.ndarray) -> DataProfile:
    """The profile of uint8 images [N, H, W] or [N, H, W, C] and their labels."""
    step = max(1, len(images) // SAMPLED_IMAGES)
    read = images[::step]
    between = np.mean((read > EDGE_LEVELS) & (read < 255 - EDGE_LEVELS)) if len(read) else 0.0
    channels = images.shape[3] if images.ndim == 4 else 1
    grey_colour = bool(channels == 3 and len(read) and
                       (read[..., 0] == read[..., 1]).all() and
                       (read[..., 1] == read[..., 2]).all())
    return DataProfile(images.shape[1], images.shape[2], channels, len(images),
                       int(labels.max()) + 1 if len(labels) else 0, float(between),
                       grey_colour)
