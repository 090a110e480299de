"""The weights of an exported folder: `model.safetensors`, under stable names.

Every variable the sampler uses (`TrainState.eval_variables()`: the parameters, EMA ones where
the run kept them, BatchNorm statistics where the model has them, and the mixture prior where
the run fitted one) is one tensor named by its path in the Flax variable tree joined with dots,
e.g. `params.decoder.Dense_0.kernel` or `prior.mixture.means`. The names follow the modules of
the family `cvae.model.registry.create_model` builds for the config in `config.json`, so the
same config gives the same names.

Synopsis:

    save_weights(path, variables, {"step": "8"})
    variables = load_weights(path)      # the nested dict again, NumPy arrays
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

WEIGHTS = "model.safetensors"
SEPARATOR = "."


def flatten(variables: dict, prefix: str = "") -> dict[str, np.ndarray]:
    """{"params": {"encoder": {... "kernel": a}}} -> {"params.encoder....kernel": a}."""
    flat = {}
    for key, value in variables.items():
        if SEPARATOR in key:
            raise ValueError(f"variable name {key!r} contains {SEPARATOR!r}")
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + SEPARATOR))
        else:
            flat[name] = np.ascontiguousarray(np.asarray(value))
    return flat


def unflatten(flat: dict[str, np.ndarray]) -> dict:
    """The inverse of `flatten`."""
    variables: dict = {}
    for name, value in sorted(flat.items()):
        *path, leaf = name.split(SEPARATOR)
        node = variables
        for key in path:
            node = node.setdefault(key, {})
        node[leaf] = value
    return variables


def save_weights(path: str | Path, variables: dict, metadata: dict[str, str]) -> None:
    save_file(flatten(variables), str(path), metadata=metadata)


def load_weights(path: str | Path) -> dict:
    return unflatten(load_file(str(path)))
