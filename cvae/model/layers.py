"""The layers the model families are built of: blocks, the convolutional stem and head, q(y|x).

Every module here reads its sizes from the run's config and the dataset's spec
(`cvae.data.specs`): images arrive flattened, f32[B, height * width * channels] in [0, 1].
Submodules are named by Flax from their class and order (`_Block_0`, `Conv_1`), and those names
are the checkpoint's parameter paths: renaming a class here breaks every stored checkpoint.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from cvae.data.specs import DatasetSpec
from cvae.errors import ConfigError
from cvae.model import convolution
from cvae.model.densities import output_channels

ACTIVATION_FNS: dict[str, Callable] = {
    "relu": nn.relu, "gelu": nn.gelu, "silu": nn.silu, "elu": nn.elu, "tanh": jnp.tanh,
    "leaky_relu": nn.leaky_relu,
}
CONV_DOWNSAMPLING = 4  # two stride-2 convolutions: the side a conv stack must divide
CONV_FEATURES = (32, 64)  # channels of the two convolutions (the head mirrors them)


def soft_clamp(x: jax.Array, bound: float) -> jax.Array:
    """Smoothly squash x into (-bound, bound); identity near zero, gradients never vanish."""
    return bound * jnp.tanh(x / bound)


def unfit_conv_sides(height: int, width: int) -> list[int]:
    """The image sides that do not halve twice: the conv stack's one constraint."""
    return [side for side in (height, width) if side % CONV_DOWNSAMPLING]


def check_conv_shape(data: DatasetSpec) -> None:
    """ConfigError unless both image sides halve twice (`unfit_conv_sides`). The message names
    the sides nearest to the bad ones that it takes."""
    bad = unfit_conv_sides(data.height, data.width)
    if bad:
        nearest = sorted({max(CONV_DOWNSAMPLING, (side // CONV_DOWNSAMPLING + up)
                              * CONV_DOWNSAMPLING) for side in bad for up in (0, 1)})
        raise ConfigError(
            f"architecture='conv': {data.name}'s {data.height}x{data.width} images do not "
            f"halve twice; the conv stack takes sides that are multiples of {CONV_DOWNSAMPLING} "
            f"(nearest: {', '.join(map(str, nearest))}; e.g. 8, 28, 32, 64): resize the "
            f"images, or use --architecture mlp")


def after_dense(h: jax.Array, options, *, train: bool) -> jax.Array:
    """What follows a dense map in every hidden block: (BatchNorm) -> activation -> (Dropout).
    Call it inside a module's compact method: its BatchNorm is that module's own."""
    return _normalise_activate_drop(h, activation=options.activation,
                                    dropout_rate=options.dropout_rate,
                                    batch_norm=options.batch_norm, train=train)


def _normalise_activate_drop(h: jax.Array, *, activation: str, dropout_rate: float,
                             batch_norm: bool, train: bool) -> jax.Array:
    """`after_dense` from its settings: `_Block` holds them as fields, not as a config."""
    if batch_norm:
        h = nn.BatchNorm(use_running_average=not train, momentum=0.9)(h)
    h = ACTIVATION_FNS[activation](h)
    if dropout_rate > 0:
        h = nn.Dropout(dropout_rate, deterministic=not train)(h)
    return h


class _Block(nn.Module):
    """Dense -> (BatchNorm) -> activation -> (Dropout)."""

    width: int
    activation: str
    dropout_rate: float
    batch_norm: bool

    @nn.compact
    def __call__(self, h: jax.Array, *, train: bool) -> jax.Array:
        return _normalise_activate_drop(nn.Dense(self.width)(h), activation=self.activation,
                                        dropout_rate=self.dropout_rate,
                                        batch_norm=self.batch_norm, train=train)


def block(options, width: int) -> _Block:
    """A hidden block of the config's activation, dropout and BatchNorm."""
    return _Block(width, options.activation, options.dropout_rate,
                  options.batch_norm)


def image_features(images: jax.Array, options, data: DatasetSpec) -> jax.Array:
    """f32[..., B, P] -> what the first dense layer reads: the pixels themselves, or with
    `architecture="conv"` two strided convolutions' maps, flattened. Call it inside a module's
    compact method: its layers are that module's own (Conv_0, Conv_1)."""
    if options.architecture != "conv":
        return images
    act = ACTIVATION_FNS[options.activation]
    lead = images.shape[:-1]
    h = images.reshape(-1, *data.image_shape)
    for features in CONV_FEATURES:
        h = act(convolution.Conv(features)(h))
    return h.reshape(*lead, -1)


def output_width(likelihood, data: DatasetSpec) -> int:
    """The decoder's outputs per image: the likelihood's parameters for every location."""
    return data.height * data.width * output_channels(likelihood, data.channels)


def pixel_logits(h: jax.Array, options, likelihood, *, data: DatasetSpec) -> jax.Array:
    """The last hidden layer f32[..., B, W] -> decoder outputs f32[..., B, M * H * W]
    (`output_width`; M outputs a location, laid out as the likelihood says): one dense
    layer, or with `architecture="conv"` a dense map at a quarter of the side and two transposed
    convolutions. Call it inside a module's compact method."""
    if options.architecture != "conv":
        return nn.Dense(output_width(likelihood, data))(h)
    act = ACTIVATION_FNS[options.activation]
    lead = h.shape[:-1]
    side_h, side_w = data.height // CONV_DOWNSAMPLING, data.width // CONV_DOWNSAMPLING
    deepest = CONV_FEATURES[-1]
    h = act(nn.Dense(side_h * side_w * deepest)(h)).reshape(-1, side_h, side_w, deepest)
    for features in CONV_FEATURES[-2::-1]:
        h = act(convolution.ConvTranspose(features)(h))
    per_location = output_channels(likelihood, data.channels)
    h = convolution.ConvTranspose(per_location)(h)
    per_value = per_location // data.channels
    if likelihood.component.parameter_major and per_value > 1:
        # [N, H, W, k * C] -> [N, k, H, W, C]: each parameter's image together
        h = jnp.moveaxis(h.reshape(*h.shape[:-1], per_value, data.channels), -2, 1)
    return h.reshape(*lead, output_width(likelihood, data))


class Classifier(nn.Module):
    """q(y | x) of the semi-supervised model (M2): image -> class logits, an MLP of the
    encoder's widths (its convolutions first with `architecture="conv"`)."""

    options: Any  # the family's options: its architecture, widths and activation
    data: DatasetSpec

    @nn.compact
    def __call__(self, images: jax.Array, *, train: bool) -> jax.Array:
        """images f32[B, P] in [0, 1] -> logits f32[B, classes]."""
        h = image_features(images, self.options, self.data)
        for width in self.options.hidden_sizes:
            h = block(self.options, width)(h, train=train)
        return nn.Dense(self.data.num_classes)(h)
