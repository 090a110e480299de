"""k-NN precision, recall and coverage: about 1 for two halves of the same data, 0 for noise,
and recall (not precision) falls when samples lose variety; exact on hand-placed points."""

from __future__ import annotations

import numpy as np
import pytest

from cvae.evaluation import fidelity
from cvae.evaluation.precision_recall import knn_radii, precision_recall
from cvae.data.synthetic import synthetic_dataset


def test_knn_radius_is_the_distance_to_the_kth_other_point():
    points = np.array([[0.0], [1.0], [3.0], [7.0]])
    # Squared distances to the other points: 0 -> 1, 9, 49; 1 -> 1, 4, 36; 3 -> 4, 9, 16; ...
    np.testing.assert_array_equal(knn_radii(points, 1), [1.0, 1.0, 4.0, 16.0])
    np.testing.assert_array_equal(knn_radii(points, 2), [9.0, 4.0, 9.0, 36.0])
    with pytest.raises(ValueError, match="k=4"):
        knn_radii(points, 4)


def test_hand_placed_points():
    real = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    # k=3 radius of each real corner is the diagonal (squared 2): 0.5,0.5 lies inside, 5,5 not.
    generated = np.array([[0.5, 0.5], [5.0, 5.0], [5.0, 6.0], [6.0, 5.0]])
    scores = precision_recall(real, generated, k=3, coverage_k=1)
    assert scores["precision"] == 0.25
    # (0.5, 0.5)'s k=3 radius reaches the farthest sample (squared 50.5), so its ball holds
    # every real point.
    assert scores["recall"] == 1.0
    # Coverage, k=1: a real corner's ball (squared radius 1) holds (0.5, 0.5) at 0.5: all four.
    assert scores["coverage"] == 1.0


def test_two_halves_of_the_same_data_score_about_one_and_noise_zero():
    rng = np.random.default_rng(0)
    data = rng.normal(size=(4000, 4)) @ rng.normal(size=(4, 4))
    halves = precision_recall(data[::2], data[1::2])
    assert min(halves.values()) >= 0.9
    far = precision_recall(data[::2], rng.normal(size=(2000, 4)) + 20.0)
    assert max(far.values()) == 0.0


def test_less_varied_samples_lose_recall_not_precision():
    rng = np.random.default_rng(1)
    real = rng.normal(size=(2000, 3))
    narrow = precision_recall(real, 0.3 * rng.normal(size=(2000, 3)))
    assert narrow["precision"] >= 0.95
    assert narrow["recall"] <= 0.3 and narrow["coverage"] <= 0.5


@pytest.fixture(scope="module")
def classifier_and_data():
    data = synthetic_dataset(num_train=512, num_test=400)
    classifier = fidelity.load_or_train_classifier(data, None, epochs=3, log=lambda _: None)
    return classifier, data


def test_on_classifier_features_real_halves_about_one_noise_zero(classifier_and_data):
    """The metric as `cvae eval` uses it: classifier features of digit-like images."""
    classifier, data = classifier_and_data
    real = fidelity.reference_scores(classifier, data.test_images, data.test_labels)
    assert min(real["precision"], real["recall"], real["coverage"]) >= 0.8
    _, reference = classifier.logits_and_features(data.test_images[1::2])
    noise = np.random.default_rng(2).uniform(size=(200, 28, 28)).astype(np.float32)
    scores = fidelity.score_images(classifier, noise, np.arange(200) % 10,
                                   reference_features=reference,
                                   reference_labels=data.test_labels[1::2])
    assert scores["precision"] <= 0.05 and scores["recall"] <= 0.05
