"""`<name>.onnx`: an exported function converted by jax2onnx (opset `OPSET`, a symbolic batch
size `B`, the weights inside as initializers); and the check against the sampler with ONNX
Runtime on the CPU.

Synopsis:

    write_onnx(folder, onnx_functions(sampler))       # sample.onnx, encode.onnx...
    report = verify_onnx(folder, sampler, noise=noise, labels=labels, digits=images)
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import jax
import numpy as np

from cvae.export.functions import Portable
from cvae.data.specs import spec_of

SUFFIX = ".onnx"
OPSET = 21  # what ONNX Runtime 1.20+ (and onnxruntime-web) runs; jax2onnx's default is 23
# The tolerances `verify_onnx` holds ONNX Runtime to, against the sampler (pixels in [0, 1]).
PIXEL_TOLERANCE = 1e-5
UINT8_TOLERANCE = 1  # each 8-bit pixel, after the service's rounding
RELATIVE_TOLERANCE = 1e-5  # encode's and classify's outputs, relative to max(1, |value|)


@contextlib.contextmanager
def _quiet():
    """jax2onnx imports every plugin it ships (some need packages cvae does not install) and
    logs each miss; onnx_ir warns about untyped intermediate shapes. Neither concerns us."""
    loggers = [logging.getLogger(name) for name in ("jax2onnx", "onnx_ir")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def convert(portable: Portable):
    """`portable.fn` as an `onnx.ModelProto`."""
    with _quiet():
        from jax2onnx import to_onnx

        specs = [jax.ShapeDtypeStruct(("B", *shape), np.dtype(dtype))
                 for _, shape, dtype in portable.inputs]
        return to_onnx(portable.fn, specs, model_name=f"cvae_{portable.name}", opset=OPSET,
                       input_names=[name for name, _, _ in portable.inputs],
                       output_names=list(portable.outputs))


def write_onnx(folder: Path, portables: list[Portable]) -> list[str]:
    import onnx

    names = []
    for portable in portables:
        model = convert(portable)
        onnx.checker.check_model(model, full_check=True)
        name = portable.name + SUFFIX
        onnx.save_model(model, str(folder / name))
        names.append(name)
    return names


def session(onnx_file: str | Path | bytes):
    """An ONNX Runtime CPU session for one exported function (its file, or its bytes)."""
    import onnxruntime

    source = onnx_file if isinstance(onnx_file, bytes) else str(onnx_file)
    return onnxruntime.InferenceSession(source, providers=["CPUExecutionProvider"])


def run_onnx(path: str | Path | bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return session(path).run(None, feeds)


def verify_onnx(folder: Path, sampler, *, noise: np.ndarray, labels: np.ndarray,
                digits: np.ndarray) -> dict:
    """ONNX Runtime against the sampler (its blocks, as `/sample` decodes) on the same inputs:
    `noise` f32[N, L] and `labels` i32[N] for sample (every pixel within `PIXEL_TOLERANCE`,
    every uint8 within `UINT8_TOLERANCE`), `digits` u8[N, h, w] for encode and classify
    (as the sampler reads them, /255; within `RELATIVE_TOLERANCE`). AssertionError naming
    the file otherwise; returns the largest differences found."""
    from cvae.sampling.grid import _to_uint8

    ours = run_onnx(folder / "sample.onnx", {"noise": noise, "label": labels})[0]
    theirs = sampler.decode(noise, labels)
    shape = spec_of(sampler.config.data.dataset).stored_shape
    report = {"rows": int(len(noise)),
              "sample_max_abs": float(np.max(np.abs(ours - theirs))),
              "sample_max_uint8": int(np.max(np.abs(_to_uint8(ours, shape).astype(int)
                                                    - _to_uint8(theirs, shape).astype(int))))}
    if report["sample_max_abs"] > PIXEL_TOLERANCE or report["sample_max_uint8"] > UINT8_TOLERANCE:
        raise AssertionError(f"sample.onnx: ONNX Runtime differs from the sampler by "
                             f"{report['sample_max_abs']:.3g} ({report['sample_max_uint8']} in "
                             f"uint8) on {len(noise)} rows")
    images = digits.reshape(len(digits), -1).astype(np.float32) / np.float32(255)
    labels = labels[:len(digits)]
    checks = {"encode": (run_onnx(folder / "encode.onnx", {"images": images, "label": labels}),
                         sampler.encode(digits, labels))}
    if sampler.has_classifier:
        checks["classify"] = (run_onnx(folder / "classify.onnx", {"images": images}),
                              [sampler.classify(digits)])
    for name, (onnx_outputs, jax_outputs) in checks.items():
        worst = max(float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b))))
                    for a, b in zip(onnx_outputs, jax_outputs))
        report[f"{name}_max_relative"] = worst
        if worst > RELATIVE_TOLERANCE:
            raise AssertionError(f"{name}.onnx: ONNX Runtime differs from the sampler by "
                                 f"{worst:.3g} (relative) on {len(images)} rows")
    return report
