"""3x3 convolutions with gradients XLA:CPU computes fast in a loop: the convnet's of stride 2,
the hierarchical family's of stride 1.

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

The hierarchical family's 3x3 convolutions of stride 1 (`Conv3x3`) go further: their input
gradient is itself a forward convolution (of the kernel flipped, its channels swapped), so
both it and the forward pass run XLA's convolution kernel, and only the kernel's gradient is
a matrix product of shifted slices. In a `lax.scan` of Adam steps this took 0.91 times the
all-slices step of the family's default shape and 0.79 times at width 64, depths 3,3,3
(docs/benchmarks.md).
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


def _same_patches(x: jax.Array) -> jax.Array:
    """[B, H, W, C] -> [B, H, W, 9C]: each pixel's 3x3 window, zero-padded ("SAME")."""
    padded = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    return _patches(padded, x.shape[1:3], 1)


def _window_kernel(kernel: jax.Array, channels: int) -> jax.Array:
    """f32[9C, F], taps in (row, column, channel) order -> HWIO f32[3, 3, C, F]."""
    return kernel.reshape(KERNEL, KERNEL, channels, -1)


@jax.custom_vjp
def same_3x3(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """x f32[B, H, W, C] convolved with kernel f32[9C, F], stride 1, "SAME": [B, H, W, F]."""
    return lax.conv_general_dilated(x, _window_kernel(kernel, x.shape[-1]), (1, 1), "SAME",
                                    dimension_numbers=DIMENSIONS)


def _same_3x3_forward(x, kernel):
    return same_3x3(x, kernel), (x, kernel)


def _same_3x3_backward(residuals, grad):
    """The input's gradient as the forward convolution of `grad` with the kernel flipped in
    space and its channels swapped; the kernel's as the windows' product with `grad`."""
    x, kernel = residuals
    flipped = jnp.flip(_window_kernel(kernel, x.shape[-1]), (0, 1)).swapaxes(2, 3)
    x_grad = lax.conv_general_dilated(grad, flipped, (1, 1), "SAME",
                                      dimension_numbers=DIMENSIONS)
    windows = _same_patches(x)
    kernel_grad = (windows.reshape(-1, windows.shape[-1]).T
                   @ grad.reshape(-1, grad.shape[-1]))
    return x_grad, kernel_grad


same_3x3.defvjp(_same_3x3_forward, _same_3x3_backward)


class Conv3x3(nn.Module):
    """A 3x3 "SAME" convolution of stride 1 with bias, its kernel kept as a Dense's over the
    3x3 windows (f32[9C, F], taps in (row, column, channel) order, initialised as
    `nn.Dense` initialises it), so that it holds the same parameters as a Dense applied to
    `_same_patches(x)` and computes the same function."""

    features: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param("kernel", nn.initializers.lecun_normal(),
                            (KERNEL * KERNEL * x.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,))
        return same_3x3(x, kernel) + bias
