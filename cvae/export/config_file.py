"""config.json of an exported folder: the run's config, which rebuilds the model, and what its
dataset's spec says of the images (shape, channels, class names), for readers without this
package. Pure Python, so the model card (`cvae.export.card`) quotes it without NumPy.
"""

from __future__ import annotations

import json

from cvae.config.sections import Config
from cvae.data import specs
from cvae.errors import CheckpointError
from cvae.data.specs import spec_of

CONFIG = "config.json"
# What config.json says of the data beside the config's own fields, so that a reader without
# this package knows the images' shape and what each label means: the dataset spec's (derived
# from `dataset`, so `read_config` checks them against the registry and drops them).
SPEC_KEYS = ("image_shape", "channels", "class_names")
# A dataset of one's own (no offline source) also carries its whole spec, which `read_config`
# registers, so the folder is read without the data it was trained on.
OWN_SPEC_KEY = "dataset_spec"


def spec_facts(config: Config) -> dict:
    """`SPEC_KEYS` of the config's dataset: image shape [h, w, c], channels, class names (from
    `cvae.data.specs`); config.json and the manifest both carry them."""
    spec = spec_of(config.data.dataset)
    return {"image_shape": list(spec.image_shape), "channels": spec.channels,
            "class_names": list(spec.class_names)}


def config_json(config: Config) -> str:
    """config.json: the run's config, then its dataset's `spec_facts`, and a dataset of one's
    own's whole spec."""
    facts = spec_facts(config)
    if spec_of(config.data.dataset).source is None:
        facts[OWN_SPEC_KEY] = spec_of(config.data.dataset).to_dict()
    return json.dumps({**config.to_dict(), **facts}, indent=2, sort_keys=True)


def read_config(text: str, where: str) -> Config:
    """config.json -> the Config; CheckpointError when its data facts are not its dataset's
    (the folder was made for images this package would shape otherwise). Folders written
    before the facts were added have none, and load as they are."""
    values = json.loads(text)
    if OWN_SPEC_KEY in values:
        specs.register(specs.DatasetSpec.from_dict(values.pop(OWN_SPEC_KEY)))
    facts = {key: values.pop(key) for key in SPEC_KEYS if key in values}
    config = Config.from_dict(values)
    expected = json.loads(config_json(config))
    wrong = [key for key, value in facts.items() if value != expected[key]]
    if wrong:
        found = "; ".join(f"{key} {facts[key]}, expected {expected[key]}" for key in wrong)
        raise CheckpointError(f"{where}: not dataset {config.data.dataset!r}'s images ({found})")
    return config
