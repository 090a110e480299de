"""Data parallelism over all local devices with `jax.sharding`, one code path for 1 or N.

A 1-D mesh named "data" spans the devices. Parameters, optimizer state and the on-device
dataset are replicated; each batch is sharded along its first axis inside the jitted step, and
XLA's SPMD partitioner inserts the gradient all-reduce. With one device every constraint is a
no-op, so the single-device run is the same program, not a special case.
"""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from cvae.errors import ConfigError

DATA_AXIS = "data"


def create_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    return Mesh(np.asarray(devices if devices is not None else jax.devices()), (DATA_AXIS,))


def replicate(tree, mesh: Mesh):
    """Place every array of `tree` in full on each device of the mesh."""
    return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))


def shard_batch(tree, mesh: Mesh):
    """Split the leading (batch) axis of every array across the mesh, inside jit."""
    return jax.lax.with_sharding_constraint(tree, NamedSharding(mesh, PartitionSpec(DATA_AXIS)))


def check_divisible(batch_size: int, mesh: Mesh) -> None:
    if batch_size % mesh.size:
        raise ConfigError(f"batch_size={batch_size}: must be a multiple of the {mesh.size} "
                          f"devices used for data parallelism")
