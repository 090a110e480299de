"""What a dataset is, stated once: its name, image shape, classes, folder and Hub id.

Everything that depends on the data (the config's choices, loading and preparation, the
model's shapes, the sampler, the service and the model card) reads a `DatasetSpec` from
`spec_of(name)`; no module keeps an image size or a class count of its own. No JAX here.
"""

from __future__ import annotations

import dataclasses

DIGITS = tuple(str(d) for d in range(10))
FASHION = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot")


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """One dataset: images uint8[N, height, width] (channels 1) or [N, height, width, 3]."""

    name: str  # the config's `dataset` value
    title: str  # as people write it, e.g. "Fashion-MNIST"
    folder: str  # its folder under the data dir (torchvision's class name for the built-ins)
    height: int
    width: int
    channels: int
    class_names: tuple[str, ...]
    hub_id: str | None = None  # the Hugging Face dataset id the model card links

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(height, width, channels)."""
        return (self.height, self.width, self.channels)

    @property
    def pixels(self) -> int:
        """Values in one flattened image: height * width * channels."""
        return self.height * self.width * self.channels


MNIST = DatasetSpec("mnist", "MNIST", "MNIST", 28, 28, 1, DIGITS, "ylecun/mnist")
FASHION_MNIST = DatasetSpec("fashion_mnist", "Fashion-MNIST", "FashionMNIST", 28, 28, 1, FASHION,
                            "zalando-datasets/fashion_mnist")

SPECS: dict[str, DatasetSpec] = {spec.name: spec for spec in (MNIST, FASHION_MNIST)}


def spec_of(name: str) -> DatasetSpec:
    """The spec of dataset `name`; ValueError naming the known ones otherwise."""
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(SPECS)}") from None
