"""Visual reports of a checkpoint: four PNG grids written by `cvae eval`.

- reconstructions.png: rows of test digits, each followed by a row of their reconstructions
  (decoded posterior means).
- label_swap.png: per row, a test image then its posterior mean z decoded with every label of
  the model's dataset (style kept, class changed).
- interpolation.png: per row, test digit A, decodings along the straight line from z_A to z_B
  (the label's one-hot interpolated alongside), then test digit B.
- temperature.png: per row one temperature; z ~ N(0, t^2 I) decoded for each class, the same
  standard-normal draws at every temperature.

Shapes and class counts are the model's dataset's (`model.data`, a `cvae.data.specs.DatasetSpec`).
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from cvae.data.pixels import to_unit
from cvae.sampling.grid import make_grid, save_png
from cvae.model.densities import pixel_means
from cvae.sampling.sampler import create_sampler

REPORT_FILES = ("reconstructions.png", "label_swap.png", "interpolation.png", "temperature.png")
RECON_COLS = 16
RECON_ROW_PAIRS = 2
SWAP_ROWS = 8
INTERP_ROWS = 6
INTERP_STEPS = 10
TEMPERATURES = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5)
TEMPERATURE_SAMPLES = 2  # per digit per row
SCALE = 2
PAD = 2


def report_shapes(num_classes: int) -> dict[str, tuple[int, int]]:
    """Expected (columns, rows) of tiles in each report of a model of `num_classes` classes,
    for tests and docs."""
    return {
        "reconstructions.png": (RECON_COLS, 2 * RECON_ROW_PAIRS),
        "label_swap.png": (1 + num_classes, SWAP_ROWS),
        "interpolation.png": (INTERP_STEPS + 2, INTERP_ROWS),
        "temperature.png": (num_classes * TEMPERATURE_SAMPLES, len(TEMPERATURES)),
    }


def _decode_soft(model, variables: dict, *, z: jax.Array, onehot: jax.Array,
                 sharpness: float) -> np.ndarray:
    logits = model.apply(variables, z, onehot, method="decode_onehot")
    return np.asarray(pixel_means(logits, sharpness, likelihood=model.likelihood,
                                  channels=model.data.channels)).reshape(
        -1, *model.data.stored_shape)


def _posterior_means(model, variables: dict, *, images_u8: np.ndarray, labels: np.ndarray):
    x = to_unit(jnp.asarray(images_u8.reshape(len(images_u8), -1)))
    mean, _ = model.apply(variables, x, jnp.asarray(labels, jnp.int32), method="encode")
    return mean


def _one_per_digit(labels: np.ndarray, count: int, rng: np.random.Generator, *,
                   num_classes: int) -> np.ndarray:
    """`count` test indices cycling through the classes 0, 1, ... (random within a class)."""
    picks = []
    for i in range(count):
        candidates = np.flatnonzero(labels == i % num_classes)
        if len(candidates) == 0:
            candidates = np.arange(len(labels))
        picks.append(int(rng.choice(candidates)))
    return np.asarray(picks)


def reconstructions(model, variables, *, images_u8, labels, rng, sharpness: float) -> np.ndarray:
    """float[2 * RECON_ROW_PAIRS * RECON_COLS, *stored shape]: input rows above output rows."""
    shape, classes = model.data.stored_shape, model.num_classes
    picks = _one_per_digit(labels, RECON_COLS * RECON_ROW_PAIRS, rng, num_classes=classes)
    mean = _posterior_means(model, variables, images_u8=images_u8[picks], labels=labels[picks])
    outputs = _decode_soft(model, variables, sharpness=sharpness, z=mean,
                           onehot=jax.nn.one_hot(labels[picks], classes))
    inputs = to_unit(images_u8[picks].reshape(-1, *shape))
    rows = []
    for pair in range(RECON_ROW_PAIRS):
        cols = slice(pair * RECON_COLS, (pair + 1) * RECON_COLS)
        rows += [inputs[cols], outputs[cols]]
    return np.concatenate(rows)


def label_swap(model, variables, *, images_u8, labels, rng, sharpness: float) -> np.ndarray:
    shape, classes = model.data.stored_shape, model.num_classes
    picks = _one_per_digit(labels, SWAP_ROWS, rng, num_classes=classes)
    mean = np.asarray(_posterior_means(model, variables, images_u8=images_u8[picks],
                                       labels=labels[picks]))
    z = np.repeat(mean, classes, axis=0)
    onehot = np.tile(np.eye(classes, dtype=np.float32), (SWAP_ROWS, 1))
    decoded = _decode_soft(model, variables, sharpness=sharpness, z=z,
                           onehot=onehot).reshape(SWAP_ROWS, classes, *shape)
    inputs = to_unit(images_u8[picks].reshape(-1, 1, *shape))
    return np.concatenate([inputs, decoded], axis=1).reshape(-1, *shape)


def interpolation(model, variables, *, images_u8, labels, rng, sharpness: float) -> np.ndarray:
    shape, classes = model.data.stored_shape, model.num_classes
    starts = _one_per_digit(labels, INTERP_ROWS, rng, num_classes=classes)
    ends = _one_per_digit(labels, INTERP_ROWS + 3, rng,
                          num_classes=classes)[3:]  # another class at the far end
    mean_a = np.asarray(_posterior_means(model, variables, images_u8=images_u8[starts],
                                         labels=labels[starts]))
    mean_b = np.asarray(_posterior_means(model, variables, images_u8=images_u8[ends],
                                         labels=labels[ends]))
    alphas = np.linspace(0.0, 1.0, INTERP_STEPS, dtype=np.float32)[None, :, None]
    z = (1 - alphas) * mean_a[:, None] + alphas * mean_b[:, None]
    eye = np.eye(classes, dtype=np.float32)
    onehot = (1 - alphas) * eye[labels[starts]][:, None] + alphas * eye[labels[ends]][:, None]
    decoded = _decode_soft(model, variables, sharpness=sharpness, z=z.reshape(-1, z.shape[-1]),
                           onehot=onehot.reshape(-1, classes)).reshape(INTERP_ROWS, -1, *shape)
    first = to_unit(images_u8[starts].reshape(-1, 1, *shape))
    last = to_unit(images_u8[ends].reshape(-1, 1, *shape))
    return np.concatenate([first, decoded, last], axis=1).reshape(-1, *shape)


def temperature_sweep(sampler, seed: int) -> np.ndarray:
    return np.concatenate([sampler.sample_images(None, TEMPERATURE_SAMPLES, seed, temperature=t)
                           for t in TEMPERATURES])


def write_reports(model, variables: dict, *, config, images_u8: np.ndarray,
                  labels: np.ndarray, out_dir: str | Path, seed: int = 0) -> dict[str, str]:
    """Write the four PNGs into out_dir; returns {name: path}. images_u8: uint8[N, *stored
    shape] of the model's dataset; `config`: the run's (how its samples are drawn and
    rendered)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = np.asarray(labels)
    sampler = create_sampler(model, config, variables)
    shown = {"images_u8": images_u8, "labels": labels,
             "sharpness": config.drawing.pixel_sharpness}
    grids = {
        "reconstructions.png": reconstructions(model, variables, **shown,
                                               rng=np.random.default_rng(seed)),
        "label_swap.png": label_swap(model, variables, **shown,
                                     rng=np.random.default_rng(seed + 1)),
        "interpolation.png": interpolation(model, variables, **shown,
                                           rng=np.random.default_rng(seed + 2)),
        "temperature.png": temperature_sweep(sampler, seed),
    }
    paths = {}
    for name, images in grids.items():
        cols = report_shapes(model.num_classes)[name][0]
        grid = make_grid(images, cols, pad=PAD, scale=SCALE, image_shape=model.data.stored_shape)
        paths[name] = str(save_png(grid, out_dir / name))
    return paths
