"""`python -m bench.redraw_screen` keeps, for each of `cvae eval`'s sample slots, the candidate
its model scores best; one candidate is `cvae eval`'s own draw."""

from __future__ import annotations

import numpy as np
import pytest

from bench.redraw_screen import COLUMNS, SCORES, best_of, candidates, image_scores, screen
from cvae import presets
from cvae.data.synthetic import synthetic_dataset
from cvae.evaluation import fidelity
from cvae.evaluation.run import EvalOptions, eval_sampler, sample_scores
from cvae.model.store import load_trained_model
from cvae.sampling.sampler import request_latents
from cvae.training.callbacks import Checkpointer
from cvae.training.loop import train_and_evaluate

PER_DIGIT = 6  # samples a digit: enough to tell draws apart, few enough to score quickly


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """A truncated mixture model of one epoch on 512 synthetic digits (enough for the
    classifier too), and three candidates of its samples."""
    directory = tmp_path_factory.mktemp("redraw-run")
    data = synthetic_dataset(num_train=512, num_test=64)
    config = presets.test().replace(epochs=1, prior="mixture", prior_components=2,
                                    truncation=0.75)
    train_and_evaluate(config, data, directory, callbacks=[Checkpointer()])
    sampler = eval_sampler(load_trained_model(directory))
    reference_labels = np.asarray(data.test_labels)[1::2]
    return directory, data, sampler, candidates(sampler, reference_labels, 3,
                                                per_digit=PER_DIGIT)


def test_one_draw_scores_as_cvae_eval_scores_the_run(drawn):
    directory, data, _, (images, _, _) = drawn
    classifier = fidelity.load_or_train_classifier(data, None, epochs=1, log=lambda _: None)
    _, reference = classifier.logits_and_features(data.test_images[1::2])
    rows = screen(str(directory), data, classifier, reference, count=2, scores=("entropy",),
                  per_digit=PER_DIGIT)
    theirs = sample_scores(load_trained_model(directory), classifier,
                           reference_features=reference,
                           reference_labels=np.asarray(data.test_labels)[1::2],
                           options=EvalOptions(samples_per_digit=PER_DIGIT, seed=0))
    assert rows["one draw"] == {k: theirs[k] for k in COLUMNS}
    assert rows["entropy"] != rows["one draw"]
    assert not np.array_equal(images[1], images[0])  # the other candidates are other draws


def test_each_kept_sample_is_its_slots_best_candidate(drawn):
    *_, (images, _, scores) = drawn
    assert set(scores) == set(SCORES)
    for name, score in scores.items():
        assert score.shape == images.shape[:2] and np.isfinite(score).all(), name
        kept = best_of(images, score)
        for slot in range(images.shape[1]):
            choices = [c for c in range(len(images)) if np.array_equal(images[c, slot],
                                                                        kept[slot])]
            assert score[choices, slot].min() == score[:, slot].min(), (name, slot)


def test_the_cycle_score_reads_the_codes_that_drew_each_image(drawn):
    """The codes of the second draw (sample seed 1) decode to its candidates, and its cycle
    score is -log q of exactly those codes under the encoder's reading of each image."""
    _, _, sampler, (images, labels, scores) = drawn
    counts = np.bincount(labels, minlength=10)
    noise = np.concatenate([request_latents(1, (d,), int(n), latent_dim=sampler.noise_dim,
                                            temperature=1.0)[0]
                            for d, n in enumerate(counts) if n])
    codes = sampler.to_codes(noise, labels.astype(np.int32))
    np.testing.assert_allclose(sampler.decode_codes(codes, labels.astype(np.int32)), images[1],
                               atol=1e-5)  # two programs: equal up to XLA's fusions
    mean, logvar, _ = sampler.encode(np.round(images[1] * 255).astype(np.uint8), labels)
    variance = np.exp(logvar.astype(np.float64))
    expected = 0.5 * ((codes - mean) ** 2 / variance + np.log(2 * np.pi * variance)).sum(-1)
    np.testing.assert_allclose(scores["cycle"][1], expected, rtol=1e-5)
    other = image_scores(sampler, images[1], labels, seed=2, names=("cycle",))
    assert not np.allclose(other["cycle"], scores["cycle"][1])
