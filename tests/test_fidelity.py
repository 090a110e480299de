"""Fidelity scorer: Fréchet distance on known Gaussians; a tiny classifier trained on synthetic
band digits scores real digits high and noise low; the classifier takes its shape and classes
from the dataset's spec, and its cache is keyed by the dataset and the data."""

from __future__ import annotations

import numpy as np
import pytest

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp

from cvae.data.specs import FASHION_MNIST, MNIST, DatasetSpec
from cvae.data.synthetic import synthetic_dataset
from cvae.evaluation import fidelity
from conftest import EVAL_CLASSIFIER, write_eval_data


def test_frechet_distance_of_known_gaussians():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(20000, 2))
    assert fidelity.frechet_distance(a, a) == pytest.approx(0.0, abs=1e-6)
    shifted = a + np.array([3.0, 4.0])
    assert fidelity.frechet_distance(a, shifted) == pytest.approx(25.0, abs=1e-6)
    # N(0, 1) vs N(0, 4) in 1-D: 1 + 4 - 2 * sqrt(1 * 4) = 1.
    wide = rng.normal(size=(20000, 1)) * 2.0
    assert fidelity.frechet_distance(rng.normal(size=(20000, 1)), wide) == pytest.approx(1, abs=0.1)


def test_label_counts_keep_the_reference_proportions_and_sum_to_the_total():
    labels = np.repeat(np.arange(10), [529, 544, 531, 499, 502, 434, 459, 509, 508, 485])
    assert fidelity.label_counts_like(labels, len(labels), num_classes=10).tolist() == \
        np.bincount(labels).tolist()
    for total in (10, 60, 97, 5000, 10000):
        counts = fidelity.label_counts_like(labels, total, num_classes=10)
        assert counts.sum() == total
        assert np.all(np.abs(counts - total * np.bincount(labels) / len(labels)) < 1)
    # A label the reference lacks gets no samples.
    assert fidelity.label_counts_like(np.array([0, 0, 1, 9]), 20, num_classes=10).tolist() == [
        10, 5, 0, 0, 0, 0, 0, 0, 0, 5]
    # One count a class of the dataset, whatever the reference holds.
    assert fidelity.label_counts_like(np.array([0, 0, 1]), 6, num_classes=3).tolist() == [4, 2, 0]


@pytest.fixture(scope="module")
def classifier_and_data(tmp_path_factory):
    data = synthetic_dataset(num_train=512, num_test=200)
    cache = tmp_path_factory.mktemp("classifier")
    classifier = fidelity.load_or_train_classifier(data, cache, epochs=3, log=lambda _: None)
    return classifier, data, cache


def test_scorer_rates_real_digits_high_and_noise_low(classifier_and_data):
    classifier, data, _ = classifier_and_data
    assert classifier.test_accuracy >= 0.9
    assert classifier.num_classes == 10 and classifier.meta["image_shape"] == [28, 28, 1]
    reference = fidelity.reference_scores(classifier, data.test_images, data.test_labels)
    _, features = classifier.logits_and_features(data.test_images[1::2])
    noise = np.random.default_rng(1).uniform(size=(100, 28, 28)).astype(np.float32)
    noise_labels = np.arange(100) % 10
    noise_scores = fidelity.score_images(classifier, noise, noise_labels,
                                         reference_features=features,
                                         reference_labels=data.test_labels[1::2])
    real_scores = fidelity.score_images(classifier, data.test_images[0::2],
                                        data.test_labels[0::2], reference_features=features,
                                        reference_labels=data.test_labels[1::2])
    assert real_scores["accuracy"] >= 0.9 and reference["accuracy"] >= 0.9
    assert noise_scores["accuracy"] <= 0.3
    assert noise_scores["fd"] > 10 * max(real_scores["fd"], 1e-3)
    assert len(noise_scores["fd_per_digit"]) == 10
    assert noise_scores["grey_share"] == pytest.approx(0.8, abs=0.01)  # uniform noise


def test_grey_pixels_are_those_strictly_inside_the_grey_band():
    """uint8 and [0, 1] floats read alike: 26/255 is grey, 230/255 (above 0.9) is not."""
    pixels = np.zeros((2, 28, 28), np.uint8)
    pixels[0, 0, :5] = [0, 26, 128, 230, 255]
    assert fidelity.grey_share(pixels) == 2 / pixels.size
    assert fidelity.grey_share(pixels / np.float32(255)) == 2 / pixels.size


def test_classifier_cache_is_reused_and_keyed_by_training_data(classifier_and_data):
    classifier, data, cache = classifier_and_data
    messages = []
    again = fidelity.load_or_train_classifier(data, cache, epochs=3, log=messages.append)
    assert messages == []  # loaded, not trained
    assert again.test_accuracy == classifier.test_accuracy
    images = np.asarray(data.test_images[:8])
    np.testing.assert_allclose(again.logits_and_features(images)[0],
                               classifier.logits_and_features(images)[0], rtol=1e-6)
    other = synthetic_dataset(num_train=512, num_test=200, seed=1)
    assert fidelity.data_checksum(other.train_images, other.train_labels) != \
        fidelity.data_checksum(data.train_images, data.train_labels)


def test_the_classifier_takes_its_shape_and_classes_from_the_spec():
    """A made-up 3-class 12x8 RGB dataset: logits one a class, features 128 wide."""
    spec = DatasetSpec("toy", "Toy", "Toy", 12, 8, 3, ("a", "b", "c"), MNIST.source)
    module = fidelity.classifier_for(spec)
    params = module.init(jax.random.key(0), jnp.zeros((1, *spec.image_shape)))["params"]
    classifier = fidelity.TrainedClassifier(params, 0.0, {}, spec)
    images = np.random.default_rng(0).integers(0, 256, (5, 12, 8, 3), dtype=np.uint8)
    logits, features = classifier.logits_and_features(images, batch_size=8)
    assert logits.shape == (5, 3) and features.shape == (5, fidelity.FEATURES)
    flat, _ = classifier.logits_and_features(images.reshape(5, -1), batch_size=8)  # flattened
    np.testing.assert_array_equal(flat, logits)


def test_a_colour_classifier_also_reads_the_shape_whatever_its_colours():
    """A red square on blue and the same square in green on red (the channels rotated): the
    same distances from the border colour, zero on the background; grey images get no extra
    input channel, colour ones one."""
    image = np.zeros((1, 8, 8, 3), np.float32)
    image[..., 2] = 1.0
    image[0, 2:6, 2:6] = (1.0, 0.0, 0.0)
    rotated = np.roll(image, 1, axis=-1)
    distance = np.asarray(fidelity.distance_from_border(jnp.asarray(image)))
    np.testing.assert_array_equal(distance, fidelity.distance_from_border(jnp.asarray(rotated)))
    assert distance.shape == (1, 8, 8, 1)
    assert distance[0, 0, 0, 0] < 1e-2 and distance[0, 3, 3, 0] > 0.8
    for spec, inputs in ((MNIST, 1), (DatasetSpec("toy", "Toy", "Toy", 8, 8, 3, ("a", "b"),
                                                  MNIST.source), 4)):
        params = fidelity.classifier_for(spec).init(jax.random.key(0),
                                                    jnp.zeros((1, *spec.image_shape)))
        assert params["params"]["Conv_0"]["kernel"].shape[2] == inputs


def test_a_small_training_set_trains_the_classifier_at_least_four_epochs_of_mnist():
    assert fidelity.classifier_epochs(60_000) == 16  # MNIST's and Fashion-MNIST's 7,488 steps
    assert fidelity.classifier_epochs(1_438) == 171  # 11 steps an epoch: 1,881 steps
    assert fidelity.classifier_epochs(10) == fidelity.CLASSIFIER_MIN_STEPS  # one step an epoch
    assert fidelity.classifier_epochs(10**6) == 16


def test_a_cached_classifier_of_another_dataset_is_not_reused(classifier_and_data, tmp_path):
    """The cache folder is named by the dataset, and its meta.json must name the same dataset,
    shape and class count: a folder of the same name written for other data is retrained."""
    classifier, data, cache = classifier_and_data
    (folder,) = [p for p in cache.iterdir() if p.is_dir()]
    assert folder.name.startswith(f"{data.name}-")
    meta = json.loads((folder / "meta.json").read_text())
    assert (meta["dataset"], meta["num_classes"]) == ("mnist", 10)
    other = tmp_path / "cache"
    (other / folder.name).mkdir(parents=True)
    (other / folder.name / "params.msgpack").write_bytes((folder / "params.msgpack").read_bytes())
    (other / folder.name / "meta.json").write_text(json.dumps({**meta, "num_classes": 3}))
    messages = []
    fidelity.load_or_train_classifier(data, other, epochs=1, log=messages.append)
    assert messages and "training the fidelity classifier" in messages[0]
    # That one took 1 epoch: asked for 3, it is retrained.
    messages = []
    fidelity.load_or_train_classifier(data, other, epochs=3, log=messages.append)
    assert messages and "(3 epochs;" in messages[0]
    # A Fashion-MNIST set of the same bytes has its own folder.
    fashion = dataclasses.replace(data, name=FASHION_MNIST.name)
    fidelity.load_or_train_classifier(fashion, other, epochs=1, log=lambda _: None)
    assert any(p.name.startswith("fashion_mnist-") for p in other.iterdir())


def test_the_eval_classifier_fixture_is_what_cvae_eval_would_train_and_cache(tmp_path):
    """tests/fixtures/eval-classifier stands in for training `eval_data_dir`'s classifier: it
    must be the cache entry `load_or_train_classifier` accepts for those digits, or the eval
    tests quietly pay the training again. After a deliberate change to the synthetic digits or
    the classifier's recipe, rewrite it with `CVAE_REFRESH_EVAL_CLASSIFIER=1 pytest
    tests/test_fidelity.py -k fixture`."""
    if os.environ.get("CVAE_REFRESH_EVAL_CLASSIFIER") == "1":
        shutil.rmtree(EVAL_CLASSIFIER, ignore_errors=True)
        EVAL_CLASSIFIER.mkdir(parents=True)  # empty: trained afresh, nothing stale kept
        write_eval_data(tmp_path / "refresh")
        shutil.rmtree(EVAL_CLASSIFIER)
        shutil.copytree(tmp_path / "refresh" / "classifier", EVAL_CLASSIFIER)
    messages = []
    write_eval_data(tmp_path / "check", log=messages.append)
    assert messages == [], f"stale {EVAL_CLASSIFIER}: {messages}"
