"""`python -m bench.redraw_screen` keeps, for each of `cvae eval`'s sample slots, the candidate
its model scores best; one candidate is `cvae eval`'s own draw."""

from __future__ import annotations

import numpy as np
import pytest

from bench.redraw_screen import SCORES, best_of, candidates, image_scores
from cvae import presets
from cvae.data.synthetic import synthetic_dataset
from cvae.evaluation.run import EvalOptions, eval_samples
from cvae.sampling.sampler import load_sampler, request_latents
from cvae.training.callbacks import Checkpointer
from cvae.training.loop import train_and_evaluate


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """A truncated mixture model of one epoch on 256 synthetic digits, and three candidates of
    its samples for the 64 test digits' labels."""
    directory = tmp_path_factory.mktemp("redraw-run")
    data = synthetic_dataset(num_train=256, num_test=64)
    config = presets.test().replace(epochs=1, prior="mixture", prior_components=2,
                                    truncation=0.75)
    train_and_evaluate(config, data, directory, callbacks=[Checkpointer()])
    sampler = load_sampler(directory, block_rows=64)
    reference_labels = np.asarray(data.test_labels)[1::2]
    return sampler, reference_labels, candidates(sampler, reference_labels, 3)


def test_the_first_candidate_is_cvae_evals_own_draw(drawn):
    sampler, reference_labels, (images, labels, _) = drawn
    own, own_labels, _ = eval_samples(sampler, reference_labels, EvalOptions(seed=0))
    assert np.array_equal(images[0], own) and np.array_equal(labels, own_labels)
    assert not np.array_equal(images[1], own)  # the other candidates are other draws


def test_each_kept_sample_is_its_slots_best_candidate(drawn):
    _, _, (images, _, scores) = drawn
    assert set(scores) == set(SCORES)
    for name, score in scores.items():
        assert score.shape == images.shape[:2] and np.isfinite(score).all(), name
        kept = best_of(images, score)
        for slot in range(images.shape[1]):
            choices = [c for c in range(len(images)) if np.array_equal(images[c, slot],
                                                                        kept[slot])]
            assert score[choices, slot].min() == score[:, slot].min(), (name, slot)


def test_the_cycle_score_reads_the_codes_that_drew_each_image(drawn):
    """The codes behind a candidate decode to that candidate, and an image scored with
    another candidate's codes scores differently."""
    sampler, _, (images, labels, scores) = drawn
    counts = np.bincount(labels, minlength=10)
    noise = np.concatenate([request_latents(1, (d,), int(n), latent_dim=sampler.noise_dim,
                                            temperature=1.0)[0]
                            for d, n in enumerate(counts) if n])
    codes = sampler.to_codes(noise, labels.astype(np.int32))
    np.testing.assert_allclose(sampler.decode_codes(codes, labels.astype(np.int32)), images[1],
                               atol=1e-5)  # two programs: equal up to XLA's fusions
    again = image_scores(sampler, images[1], labels, seed=1, counts=counts,
                         names=("cycle", "entropy"))
    assert all(np.array_equal(again[name], scores[name][1]) for name in again)
    wrong = image_scores(sampler, images[1], labels, seed=2, counts=counts, names=("cycle",))
    assert not np.array_equal(wrong["cycle"], scores["cycle"][1])
