"""Sample fidelity: a small classifier of the dataset's images, and the scores it gives to
generated ones.

The classifier (two 5x5 stride-2 convolutions, 32 and 64 channels, then dense 128 and one logit
a class, with dropout while it trains) takes its input shape and class count from the dataset's
spec (`cvae.data.specs`); a colour image's also reads each pixel's distance from the image's
border colour (`distance_from_border`). It is trained once per dataset on its training set, 16
epochs (about where its test accuracy stops rising: Fashion-MNIST's reads 92.2%, the old
4-epoch net of half the width 90.1%), and cached beside the data as
`<data-dir>/classifier/<dataset>-<sha12>-v<version>/` (msgpack weights + meta.json), where sha12
is a checksum of the training images and labels: another dataset, or other data, gets another
classifier. Generated
samples are scored by (1) the fraction the classifier assigns to the digit they were conditioned
on and (2) the Fréchet distance between the classifier's 128-d penultimate features of samples
and of real test digits, overall and per digit, and (3) k-NN precision, recall and coverage in
the same feature space (`cvae.evaluation.precision_recall`). Real test digits scored the same way
are the reference: their accuracy, and the scores of one half of the test set against the other.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import time
from pathlib import Path
from typing import Callable

import flax.linen as nn
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax

from cvae.data.pixels import to_unit
from cvae.data.specs import DatasetSpec, spec_of
from cvae.evaluation.precision_recall import precision_recall

FEATURES = 128
# Pixels strictly between these are grey: a real stroke's anti-aliased edge, or a mean's blur.
GREY_PIXELS = (0.1, 0.9)
CLASSIFIER_VERSION = 2  # bump when the architecture or recipe changes: invalidates caches
# How long the classifier trains: 16 epochs, and at least 1,872 steps (4 epochs of MNIST's
# 60,000 images at batch 128), so that a small data set (1,438 images: 11 steps an epoch) is
# not read by a classifier that took 176 steps and reads its test images at chance.
CLASSIFIER_EPOCHS, CLASSIFIER_BATCH = 16, 128
CLASSIFIER_MIN_STEPS = 4 * (60_000 // CLASSIFIER_BATCH)
# Dropout on the flattened convolutions and the features while training: without it the wider
# net overfits Fashion-MNIST (91.7% at 12 epochs; 0.5 read 91.8%, random shifts 91.2%).
CLASSIFIER_DROPOUT = 0.3


class Classifier(nn.Module):
    """images float32[B, h, w, c] (or any shape of B * h * w * c values) in [0, 1] ->
    (logits [B, num_classes], penultimate features [B, 128]); (h, w, c) = `image_shape`.
    `train` drops units (the "dropout" rng); the features are always those before dropout."""

    image_shape: tuple[int, int, int]
    num_classes: int

    @nn.compact
    def __call__(self, images: jax.Array, *, train: bool = False):
        dropout = nn.Dropout(CLASSIFIER_DROPOUT, deterministic=not train)
        h = images.reshape(-1, *self.image_shape)
        if self.image_shape[-1] > 1:
            h = jnp.concatenate([h, distance_from_border(h)], axis=-1)
        h = nn.relu(nn.Conv(32, (5, 5), strides=2)(h))  # 28x28 -> 14x14
        h = nn.relu(nn.Conv(64, (5, 5), strides=2)(h))  # -> 7x7
        features = nn.relu(nn.Dense(FEATURES)(dropout(h.reshape(h.shape[0], -1))))
        return nn.Dense(self.num_classes)(dropout(features)), features


def distance_from_border(images: jax.Array) -> jax.Array:
    """float[B, h, w, c] -> float[B, h, w, 1]: each pixel's RMS distance over the channels from
    its image's mean border colour. A colour image's classifier reads it beside the colours: the
    figure's shape whatever its colours (seeded colour digits, tinted at random on random
    backgrounds: 47.6% of the real test images read without it, 83.6% with it)."""
    ring = jnp.concatenate([images[:, 0], images[:, -1], images[:, :, 0], images[:, :, -1]],
                           axis=1)
    border = ring.mean(axis=1)[:, None, None, :]
    return jnp.sqrt(jnp.mean(jnp.square(images - border), axis=-1, keepdims=True) + 1e-6)


def classifier_for(spec: DatasetSpec) -> Classifier:
    """The classifier's module for dataset `spec`: its image shape and class count."""
    return Classifier(tuple(spec.image_shape), spec.num_classes)


@dataclasses.dataclass
class TrainedClassifier:
    params: dict
    test_accuracy: float
    meta: dict
    spec: DatasetSpec  # the dataset it was trained on: its input shape and classes
    apply_fn: Callable = None

    def __post_init__(self):
        self.apply_fn = jax.jit(classifier_for(self.spec).apply)

    @property
    def num_classes(self) -> int:
        return self.spec.num_classes

    def logits_and_features(self, images: np.ndarray, batch_size: int = 1000):
        """images: float32[N, ...] in [0, 1] or uint8, N images of the spec's shape (stored
        or flattened) -> (logits f32[N, classes], features f64[N, 128])."""
        images = _as_float(images).reshape(-1, *self.spec.image_shape)
        logits, feats = [], []
        for start in range(0, len(images), batch_size):
            rows = images[start:start + batch_size]
            pad = batch_size - len(rows)
            out_logits, out_feats = self.apply_fn(
                {"params": self.params}, np.pad(rows, ((0, pad),) + ((0, 0),) * 3))
            logits.append(np.asarray(out_logits)[:len(rows)])
            feats.append(np.asarray(out_feats, np.float64)[:len(rows)])
        return np.concatenate(logits), np.concatenate(feats)


def _as_float(images: np.ndarray) -> np.ndarray:
    """uint8 levels or floats in [0, 1], any shape -> float32 intensities, the same shape."""
    images = np.asarray(images)
    return to_unit(images) if images.dtype == np.uint8 else images.astype(np.float32)


def data_checksum(images: np.ndarray, labels: np.ndarray) -> str:
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(images, np.uint8).tobytes())
    digest.update(np.ascontiguousarray(labels, np.int32).tobytes())
    return digest.hexdigest()


def classifier_epochs(count: int) -> int:
    """Epochs of the classifier on `count` training images: CLASSIFIER_EPOCHS, or more when
    that is under CLASSIFIER_MIN_STEPS steps."""
    steps_per_epoch = max(1, count // CLASSIFIER_BATCH)
    return max(CLASSIFIER_EPOCHS, -(-CLASSIFIER_MIN_STEPS // steps_per_epoch))


def train_classifier(train_images: np.ndarray, train_labels: np.ndarray, *, spec: DatasetSpec,
                     epochs: int = CLASSIFIER_EPOCHS, batch_size: int = CLASSIFIER_BATCH,
                     learning_rate: float = 2e-3,
                     seed: int = 0) -> dict:
    """The parameters of `classifier_for(spec)` trained on the images (uint8, the spec's
    shape) and labels: Adam with cosine decay; the data lives on the device, one jitted step
    per batch.

    (A `lax.scan` over steps, as the VAE uses, made XLA:CPU's convolutions several times slower;
    at ~30 ms a step the per-step dispatch is negligible.)
    """
    module = classifier_for(spec)
    images = jnp.asarray(np.asarray(train_images).reshape(-1, *spec.image_shape), jnp.uint8)
    labels = jnp.asarray(train_labels, jnp.int32)
    steps_per_epoch = max(1, len(images) // batch_size)
    tx = optax.adam(optax.cosine_decay_schedule(learning_rate, epochs * steps_per_epoch))
    key, dropout_key = jax.random.split(jax.random.key(seed))
    params = module.init(key, jnp.zeros((1, *spec.image_shape)))["params"]
    opt_state = tx.init(params)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, order, *, first, dropout_key):
        idx = jax.lax.dynamic_slice_in_dim(order, first * batch_size, batch_size)
        x, y = to_unit(images[idx]), labels[idx]

        def loss_fn(params):
            logits, _ = module.apply({"params": params}, x, train=True,
                                     rngs={"dropout": dropout_key})
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        updates, opt_state = tx.update(jax.grad(loss_fn)(params), opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    for epoch in range(epochs):
        order = jax.random.permutation(jax.random.fold_in(key, epoch), len(images))
        for first in range(steps_per_epoch):
            params, opt_state = step(params, opt_state, order, first=first,
                                     dropout_key=jax.random.fold_in(
                                         dropout_key, epoch * steps_per_epoch + first))
    return jax.device_get(params)


def accuracy(classifier: TrainedClassifier, images: np.ndarray, labels: np.ndarray) -> float:
    logits, _ = classifier.logits_and_features(images)
    return float(np.mean(logits.argmax(axis=1) == np.asarray(labels)))


def load_or_train_classifier(data, cache_root: str | Path | None, *, epochs: int | None = None,
                             log: Callable[[str], None] = print) -> TrainedClassifier:
    """The cached classifier for `data`'s training set, training (and caching) it if missing.
    Its shape and classes are those of `data`'s dataset (`spec_of(data.name)`); the cache
    folder is named by the dataset and the checksum of its training data, and a cached one is
    used only if its meta.json names the same dataset, checksum, image shape, class count and
    epochs (None: `classifier_epochs` of the training set's size).

    `cache_root` None trains without caching (tests).
    """
    spec = spec_of(data.name)
    epochs = classifier_epochs(len(data.train_images)) if epochs is None else epochs
    checksum = data_checksum(data.train_images, data.train_labels)
    folder = (Path(cache_root) / f"{data.name}-{checksum[:12]}-v{CLASSIFIER_VERSION}"
              if cache_root is not None else None)
    identity = {"train_sha256": checksum, "dataset": data.name,
                "image_shape": list(spec.image_shape), "num_classes": spec.num_classes,
                "epochs": epochs}
    if folder is not None and (folder / "meta.json").is_file():
        meta = json.loads((folder / "meta.json").read_text())
        # A cache written before the shape was recorded is MNIST's, whose name it carries.
        meta.setdefault("image_shape", list(spec.image_shape) if meta.get("dataset") == "mnist"
                        else None)
        meta.setdefault("num_classes", spec.num_classes if meta.get("dataset") == "mnist"
                        else None)
        if all(meta.get(key) == value for key, value in identity.items()):
            template = classifier_for(spec).init(jax.random.key(0),
                                                 jnp.zeros((1, *spec.image_shape)))["params"]
            params = flax.serialization.from_bytes(template,
                                                   (folder / "params.msgpack").read_bytes())
            return TrainedClassifier(params, meta["test_accuracy"], meta, spec)
    log(f"training the fidelity classifier on {len(data.train_images)} images "
        f"({epochs} epochs; cached afterwards)")
    start = time.perf_counter()
    params = train_classifier(data.train_images, data.train_labels, spec=spec, epochs=epochs)
    seconds = time.perf_counter() - start
    classifier = TrainedClassifier(params, 0.0, {}, spec)
    classifier.test_accuracy = accuracy(classifier, data.test_images, data.test_labels)
    classifier.meta = {**identity, "test_accuracy": classifier.test_accuracy,
                       "train_seconds": seconds, "version": CLASSIFIER_VERSION}
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "params.msgpack").write_bytes(flax.serialization.to_bytes(params))
        (folder / "meta.json").write_text(json.dumps(classifier.meta, indent=2) + "\n")
        log(f"classifier: test accuracy {classifier.test_accuracy:.4f}, cached in {folder}")
    return classifier


# ---- Fréchet distance -----------------------------------------------------------------------


def frechet_distance(features_a: np.ndarray, features_b: np.ndarray) -> float:
    """||mu_a - mu_b||^2 + Tr(S_a + S_b - 2 (S_a S_b)^1/2) between two feature sets [N, D].

    Tr (S_a S_b)^1/2 = sum sqrt(eig(S_a^1/2 S_b S_a^1/2)), a symmetric PSD matrix, so only
    `eigh` is needed and the result is real.
    """
    a = np.asarray(features_a, np.float64)
    b = np.asarray(features_b, np.float64)
    mu_a, mu_b = a.mean(axis=0), b.mean(axis=0)
    cov_a = np.atleast_2d(np.cov(a, rowvar=False))
    cov_b = np.atleast_2d(np.cov(b, rowvar=False))
    values, vectors = np.linalg.eigh(cov_a)
    root_a = (vectors * np.sqrt(np.clip(values, 0, None))) @ vectors.T
    middle = np.linalg.eigvalsh(root_a @ cov_b @ root_a)
    trace_root = np.sum(np.sqrt(np.clip(middle, 0, None)))
    distance = np.sum(np.square(mu_a - mu_b)) + np.trace(cov_a) + np.trace(cov_b) - 2 * trace_root
    return float(max(distance, 0.0))


# ---- Scores ---------------------------------------------------------------------------------


def _per_digit_means(values: np.ndarray, labels: np.ndarray, num_classes: int) -> list[float]:
    return [float(values[labels == digit].mean()) if np.any(labels == digit) else float("nan")
            for digit in range(num_classes)]


def grey_share(images: np.ndarray) -> float:
    """The fraction of pixels that are grey (`GREY_PIXELS`): what `--pixel-sharpness` moves."""
    pixels = _as_float(images)
    return float(((pixels > GREY_PIXELS[0]) & (pixels < GREY_PIXELS[1])).mean())


def label_counts_like(reference_labels: np.ndarray, total: int, *, num_classes: int
                      ) -> np.ndarray:
    """i64[num_classes] label counts summing to `total` in the proportions of
    `reference_labels` (largest remainders). Samples drawn so are the model's
    p(x) = sum_y p(y) p(x|y) with the data's p(y): drawn 500 a digit against the test set's
    counts (434 to 544 a digit in its odd half), a set of real digits itself scores FD 2.60
    instead of 2.10 (docs/evaluation.md)."""
    frequencies = np.bincount(np.asarray(reference_labels), minlength=num_classes)
    exact = total * frequencies / frequencies.sum()
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(counts - exact, kind="stable")[:total - counts.sum()]] += 1
    return counts


def score_images(classifier: TrainedClassifier, images: np.ndarray, labels: np.ndarray,
                 *, reference_features: np.ndarray, reference_labels: np.ndarray) -> dict:
    """Accuracy w.r.t. `labels` and Fréchet distance to the reference features, overall and per
    class, k-NN precision, recall and coverage against the reference features, and the share of
    grey pixels: {"accuracy", "accuracy_per_digit": [C], "fd", "fd_per_digit": [C],
    "precision", "recall", "coverage", "grey_share"}, C the classifier's classes (its logits'
    width)."""
    labels, reference_labels = np.asarray(labels), np.asarray(reference_labels)
    logits, features = classifier.logits_and_features(images)
    classes = logits.shape[1]
    correct = logits.argmax(axis=1) == labels
    per_digit_fd = []
    for digit in range(classes):
        mine, theirs = labels == digit, reference_labels == digit
        per_digit_fd.append(frechet_distance(features[mine], reference_features[theirs])
                            if mine.sum() > 1 and theirs.sum() > 1 else float("nan"))
    return {"accuracy": float(correct.mean()),
            "accuracy_per_digit": _per_digit_means(correct, labels, classes),
            "fd": frechet_distance(features, reference_features), "fd_per_digit": per_digit_fd,
            **precision_recall(reference_features, features), "grey_share": grey_share(images)}


def reference_scores(classifier: TrainedClassifier, test_images: np.ndarray,
                     test_labels: np.ndarray) -> dict:
    """Real test digits scored like samples: accuracy on all of them, and the Fréchet distance,
    precision, recall and coverage of the even-indexed half against the odd-indexed half (what
    a perfect model would reach at that sample size)."""
    test_labels = np.asarray(test_labels)
    _, features = classifier.logits_and_features(test_images[1::2])
    half = score_images(classifier, test_images[0::2], test_labels[0::2],
                        reference_features=features,
                        reference_labels=test_labels[1::2])
    logits = classifier.logits_and_features(test_images)[0]
    correct = logits.argmax(axis=1) == test_labels
    return {**half, "accuracy": float(correct.mean()),
            "accuracy_per_digit": _per_digit_means(correct, test_labels, logits.shape[1]),
            "fd_protocol": "even-indexed half vs odd-indexed half of the test set"}
