"""Data parallelism over every device of every process with `jax.sharding`, one code path.

A 1-D mesh named "data" spans `jax.devices()`: the local devices, or after
`cvae.training.processes.initialize` the devices of all processes. Parameters, optimizer state and
the on-device dataset are replicated; each global batch is split along its first axis, device d
gathering only its own rows (`gather_rows`), and XLA's SPMD partitioner inserts the gradient
all-reduce. With one device every constraint is a no-op, so the single-device run is the same
program, not a special case.
"""

from __future__ import annotations

import re
from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from cvae.errors import ConfigError

DATA_AXIS = "data"
_ALL_REDUCE = re.compile(r"=\s*(.*?)\s+all-reduce(?:-start)?\(")
_SHAPE = re.compile(r"\b(pred|bf16|[fsu]\d+)\[([\d,]*)\]")


def create_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    return Mesh(np.asarray(devices if devices is not None else jax.devices()), (DATA_AXIS,))


def replicate(tree, mesh: Mesh):
    """Place every array of `tree` in full on each device of the mesh."""
    return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))


def shard_batch(tree, mesh: Mesh):
    """Split the leading (batch) axis of every array across the mesh, inside jit."""
    return jax.lax.with_sharding_constraint(tree, NamedSharding(mesh, PartitionSpec(DATA_AXIS)))


def gather_rows(mesh: Mesh, arrays: tuple[jax.Array, ...], order: jax.Array, *, start,
                batch_size: int) -> tuple[jax.Array, ...]:
    """Rows order[start : start + batch_size] of each array, split over the mesh (inside jit).

    Every device holds the whole (replicated) dataset and the same order, and gathers only its
    own batch_size / mesh.size rows: device d takes rows d * B/D .. (d + 1) * B/D - 1 of the
    global batch. So each process feeds only its part of every global batch, and the global
    batch is the same whatever the number of processes and devices.
    """
    per_device = batch_size // mesh.size

    def own_rows(*operands):
        *arrays, order, start = operands
        first = start + jax.lax.axis_index(DATA_AXIS) * per_device
        idx = jax.lax.dynamic_slice_in_dim(order, first, per_device)
        return tuple(array[idx] for array in arrays)

    replicated, split = PartitionSpec(), PartitionSpec(DATA_AXIS)
    return jax.shard_map(own_rows, mesh=mesh, in_specs=(replicated,) * (len(arrays) + 2),
                         out_specs=(split,) * len(arrays))(*arrays, order, start)


def check_divisible(batch_size: int, mesh: Mesh) -> None:
    if batch_size % mesh.size:
        raise ConfigError(f"batch_size={batch_size}: must be a multiple of the {mesh.size} "
                          f"devices used for data parallelism")


def all_reduce_bytes(compiled_hlo: str) -> tuple[int, int]:
    """(bytes, ops) all-reduced by one run of a compiled program, read from its HLO text.

    What data parallelism costs in communication per step: pass
    `train_chunk.jitted.lower(..., num_steps=1).compile().as_text()`. Each all-reduce's result
    shapes are summed (XLA fuses the gradients of all parameters into one tuple all-reduce).
    """
    total, ops = 0, 0
    for match in _ALL_REDUCE.finditer(compiled_hlo):
        ops += 1
        for dtype, dims in _SHAPE.findall(match.group(1)):
            size = 1 if dtype == "pred" else int(dtype.lstrip("bfsu")) // 8
            for dim in filter(None, dims.split(",")):
                size *= int(dim)
            total += size
    return total, ops
