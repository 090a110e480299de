"""`POST /classify` (service/routes/classify.py) and `/transfer`'s reading of the label with a
few-label model's classifier q(y|x), through TestClient on real checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from cvae.limits import MAX_UPLOAD_BYTES
from cvae.sampling.sampler import load_sampler
from service.app import create_app
from test_digit_image import encoded, seven
from test_service_transfer import BAD_UPLOADS, refused


@pytest.fixture(scope="module")
def client(few_label_run):
    with TestClient(create_app(few_label_run.directory)) as client:
        yield client


def test_held_out_test_digits_get_their_labels(client, few_label_run):
    data = few_label_run.data
    sampler = load_sampler(few_label_run.directory)
    for image, label in zip(data.test_images[:20], data.test_labels[:20]):
        response = client.post("/classify?prepare=none", content=encoded(image))
        assert response.status_code == 200, response.text
        reading = response.json()
        assert reading["label"] == label
        assert reading["step"] == few_label_run.steps[-1]
        assert len(reading["probabilities"]) == 10
        assert sum(reading["probabilities"]) == pytest.approx(1.0, abs=1e-5)
        assert reading["probabilities"] == sampler.classify(image[None])[0].tolist()


def test_transfer_reads_the_label_with_the_classifier(client, few_label_run):
    data = few_label_run.data
    for image, label in zip(data.test_images[:5], data.test_labels[:5]):
        response = client.post("/transfer?prepare=none&digits=3", content=encoded(image))
        assert response.status_code == 200, response.text
        assert response.headers["x-label"] == str(label)


def test_transfer_takes_q_reading_where_the_best_elbo_would_read_otherwise(client,
                                                                          few_label_run):
    """On noise pictures the two readings disagree; /transfer follows q(y|x)."""
    sampler = load_sampler(few_label_run.directory)
    noise = np.random.default_rng(0).integers(0, 256, (12, 28, 28), dtype=np.uint8)
    by_q = np.argmax(sampler.classify(noise), axis=-1)
    _, _, neg_elbo = sampler.encode(np.repeat(noise, 10, axis=0), np.tile(np.arange(10), 12))
    by_elbo = np.argmin(neg_elbo.reshape(12, 10), axis=-1)
    assert np.any(by_q != by_elbo)
    for image, label in zip(noise, by_q):
        response = client.post("/transfer?prepare=none&digits=3", content=encoded(image))
        assert response.headers["x-label"] == str(label)


def test_classifier_reading_does_not_depend_on_the_batch(few_label_run):
    sampler = load_sampler(few_label_run.directory)
    images = few_label_run.data.test_images[:37]
    together = sampler.classify(images)
    alone = np.concatenate([sampler.classify(images[i:i + 1]) for i in range(len(images))])
    assert np.array_equal(together, alone)


def test_a_model_trained_with_every_label_reads_by_bayes_rule(trained_run):
    """No q(y|x): the reading is Bayes' rule on its bounds on p(x|y), with the same JSON, and a
    picture's reading does not depend on its neighbours (the verified blocks)."""
    with TestClient(create_app(trained_run.directory)) as plain:
        response = plain.post("/classify", content=encoded(seven()))
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"probabilities", "label", "name", "class_names", "step"}
    assert abs(sum(body["probabilities"]) - 1) < 1e-5
    assert body["label"] == int(np.argmax(body["probabilities"]))
    assert body["class_names"] == list("0123456789") and body["name"] == str(body["label"])
    sampler = load_sampler(trained_run.directory)
    images = trained_run.data.test_images[:13]
    together = sampler.classify(images)
    alone = np.concatenate([sampler.classify(images[i:i + 1]) for i in range(len(images))])
    assert np.array_equal(together, alone)


@pytest.mark.parametrize("body, status, kind, words", BAD_UPLOADS)
def test_bad_upload_gets_the_transfer_error(client, body, status, kind, words):
    message = refused(client.post("/classify", content=body), status, kind)
    assert words in message
    assert message == refused(client.post("/transfer", content=body), status, kind)


def test_prepare_none_wants_28x28_and_not_blank_and_a_bad_prepare_is_named(client):
    assert "280x280" in refused(client.post("/classify?prepare=none", content=encoded(seven())),
                                422, "wrong_size")
    blank = encoded(np.zeros((28, 28), np.uint8))
    assert "blank" in refused(client.post("/classify?prepare=none", content=blank), 422,
                              "no_digit")
    response = client.post("/classify?prepare=crop", content=encoded(seven()))
    assert response.status_code == 422
    assert response.json()["message"].startswith("prepare: must be")


def test_body_over_the_limit_is_413(client):
    refused(client.post("/classify", content=b"\0" * (MAX_UPLOAD_BYTES + 1)), 413,
            "body_too_large")
    assert client.post("/classify", content=encoded(seven())).status_code == 200
