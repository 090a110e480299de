"""`<name>.stablehlo`: an exported function serialized with `jax.export`, for CPU and CUDA,
with a symbolic batch size `b`; and the check that it gives the sampler's bits.

Synopsis:

    write_stablehlo(folder, exact_functions(sampler))   # sample.stablehlo, encode.stablehlo...
    exported = load_stablehlo(folder / "sample.stablehlo")
    images = exported.call(noise, labels)               # any batch size
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from cvae.export.functions import Portable

SUFFIX = ".stablehlo"
PLATFORMS = ("cpu", "cuda")  # lowered for both: the same file runs on either


def export_function(portable: Portable) -> bytes:
    """`portable.fn` lowered for `PLATFORMS` with a symbolic batch dimension, serialized."""
    batch, = jax.export.symbolic_shape("b")
    specs = [jax.ShapeDtypeStruct((batch, *shape), np.dtype(dtype))
             for _, shape, dtype in portable.inputs]
    exported = jax.export.export(jax.jit(portable.fn), platforms=PLATFORMS)(*specs)
    return bytes(exported.serialize())


def write_stablehlo(folder: Path, portables: list[Portable]) -> list[str]:
    names = []
    for portable in portables:
        name = portable.name + SUFFIX
        (folder / name).write_bytes(export_function(portable))
        names.append(name)
    return names


def load_stablehlo(path: str | Path) -> jax.export.Exported:
    return jax.export.deserialize(bytearray(Path(path).read_bytes()))


def verify_stablehlo(folder: Path, sampler, inputs: dict[str, tuple]) -> dict:
    """Each deserialized function against the sampler's own program on the same inputs (one
    of its block shapes, as the sampler pads to): bit for bit, else AssertionError.

    `inputs`: name -> the arguments (NumPy arrays of one block's rows). Returns name -> rows
    compared.
    """
    direct = {"sample": sampler.decode_fn, "encode": sampler.encode_fn,
              "classify": sampler.classify_fn}
    checked = {}
    for name, args in inputs.items():
        exported = load_stablehlo(folder / (name + SUFFIX))
        ours = jax.tree.leaves(exported.call(*args))
        theirs = jax.tree.leaves(direct[name](sampler.variables, *args))
        for index, (a, b) in enumerate(zip(ours, theirs)):
            a, b = np.asarray(a), np.asarray(b)
            if a.shape != b.shape or not np.array_equal(a.view(np.uint32), b.view(np.uint32)):
                raise AssertionError(
                    f"{name}{SUFFIX}: output {index} differs from the sampler's on "
                    f"{len(args[0])} rows (max |difference| "
                    f"{float(np.max(np.abs(a - b))) if a.shape == b.shape else 'shape'})")
        checked[name] = len(args[0])
    return checked
