"""The convnet's 3x3 stride-2 convolutions, with gradients XLA:CPU computes fast in a loop.

`--architecture conv` trains through a `lax.scan` of steps, and inside that loop XLA:CPU emits
the convolutions of the backward pass (the kernel's gradient and the transposed input
gradient) as plain loops rather than its fast convolution kernels: a step took about 4x as
long inside the loop as outside it (`python -m bench.conv_step`; docs/model.md, "The
convolutional encoder and decoder").
So the forward pass here is `flax.linen.Conv` / `flax.linen.ConvTranspose`'s own convolution
(3x3 kernel, stride 2, "SAME" padding, kernel not flipped: the same values, bit for bit, and
the same parameters under the same names, so checkpoints move between the two), and the
backward pass is the gradient of the same convolution written as shifted slices of the padded
input times the kernel: pads, slices and one matrix product, which XLA runs as fast in a loop
as outside it.
"""

from __future__ import annotations

import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

KERNEL = 3
STRIDE = 2
DIMENSIONS = ("NHWC", "HWIO", "NHWC")


def _patches(padded: jax.Array, size: tuple[int, int], step: int) -> jax.Array:
    """[B, H, W, C] -> [B, h, w, 9C]: for each output pixel the 3x3 window at `step`, its taps
    in the kernel's (row, column, channel) order."""
    h, w = size
    batch, _, _, channels = padded.shape
    taps = [lax.slice(padded, (0, i, j, 0),
                      (batch, i + step * (h - 1) + 1, j + step * (w - 1) + 1, channels),
                      (1, step, step, 1))
            for i in range(KERNEL) for j in range(KERNEL)]
    return jnp.concatenate(taps, axis=-1)


def _as_matmul(x: jax.Array, kernel: jax.Array, *, transpose: bool) -> jax.Array:
    """The convolution as patches times the kernel: what the backward pass differentiates."""
    _, h, w, _ = x.shape
    if transpose:  # zeros between the pixels (the stride), padded as lax.conv_transpose pads
        spread = lax.pad(x, jnp.zeros((), x.dtype),
                         ((0, 0, 0), (2, 1, STRIDE - 1), (2, 1, STRIDE - 1), (0, 0, 0)))
        patches = _patches(spread, (STRIDE * h, STRIDE * w), 1)
    else:  # "SAME", padded as lax.conv_general_dilated pads
        pads = lax.padtype_to_pads((h, w), (KERNEL, KERNEL), (STRIDE, STRIDE), "SAME")
        padded = jnp.pad(x, ((0, 0), *pads, (0, 0)))
        patches = _patches(padded, (-(-h // STRIDE), -(-w // STRIDE)), STRIDE)
    return patches @ kernel.reshape(-1, kernel.shape[-1])


def as_flax(x: jax.Array, kernel: jax.Array, *, transpose: bool) -> jax.Array:
    """The convolution as flax.linen computes it (no bias)."""
    if transpose:
        return lax.conv_transpose(x, kernel, (STRIDE, STRIDE), "SAME",
                                  dimension_numbers=DIMENSIONS)
    return lax.conv_general_dilated(x, kernel, (STRIDE, STRIDE), "SAME",
                                    dimension_numbers=DIMENSIONS)


def _with_matmul_gradient(*, transpose: bool) -> Callable:
    """`fn(x, kernel)`: flax's convolution forward, the matrix products' gradient backward."""

    @jax.custom_vjp
    def convolve(x, kernel):
        return as_flax(x, kernel, transpose=transpose)

    def forward(x, kernel):
        return convolve(x, kernel), (x, kernel)

    def backward(residuals, grad):
        _, pullback = jax.vjp(functools.partial(_as_matmul, transpose=transpose), *residuals)
        return pullback(grad)

    convolve.defvjp(forward, backward)
    return convolve


CONVOLVE = {False: _with_matmul_gradient(transpose=False),
            True: _with_matmul_gradient(transpose=True)}


class _Convolution(nn.Module):
    features: int
    transpose = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param("kernel", nn.initializers.lecun_normal(),
                            (KERNEL, KERNEL, x.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,))
        return CONVOLVE[self.transpose](x, kernel) + bias


class Conv(_Convolution):
    """`nn.Conv(features, (3, 3), strides=2)` on NHWC: H -> ceil(H / 2)."""


class ConvTranspose(_Convolution):
    """`nn.ConvTranspose(features, (3, 3), strides=(2, 2))` on NHWC: H -> 2H."""

    transpose = True
