"""`python -m bench.sampler_dials` refits the mixture exactly as training's last fit made it, and
scores each setting's samples exactly as `cvae eval` does."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bench.sampler_dials import (COLUMNS, centre_doubt, refit_prior, sweep, with_weight_power,
                                 without_doubtful)
from cvae import presets
from cvae.data.synthetic import synthetic_dataset
from cvae.evaluation import fidelity
from cvae.evaluation.run import EvalOptions, rendered_at, sample_scores
from cvae.model.store import load_trained_model
from cvae.training.callbacks import Checkpointer
from cvae.training.loop import train_and_evaluate


@pytest.fixture(scope="module")
def mixture_run(tmp_path_factory):
    """The test config with a fitted mixture of 2 components a class: 2 epochs of 512
    synthetic digits, a few seconds."""
    directory = tmp_path_factory.mktemp("mixture-run")
    data = synthetic_dataset(num_train=512, num_test=64)  # enough for the classifier too
    config = presets.test().replace(epochs=2, prior="mixture", prior_components=2)
    train_and_evaluate(config, data, directory, callbacks=[Checkpointer()])
    return directory, data


def test_the_refit_with_the_runs_own_components_is_its_mixture_bit_for_bit(mixture_run):
    directory, data = mixture_run
    checkpoint = load_trained_model(directory)
    saved = checkpoint.variables["prior"]["mixture"]
    again = refit_prior(checkpoint, data, 2).variables["prior"]["mixture"]
    assert all(np.array_equal(np.asarray(saved[k]), np.asarray(again[k])) for k in saved)
    wider = refit_prior(checkpoint, data, 3)
    assert wider.config.prior_components == 3
    assert np.asarray(wider.variables["prior"]["mixture"]["means"]).shape == (10, 3, 4)
    assert np.allclose(np.asarray(wider.variables["prior"]["mixture"]["weights"]).sum(-1), 1)


def test_a_refit_to_other_codes_and_components_is_what_training_with_them_fits(
        mixture_run, tmp_path):
    """The fit never feeds back into training, so a run trained with `--prior-codes samples
    --prior-components 3` has the same weights, and its mixture is the refit's."""
    directory, data = mixture_run
    config = load_trained_model(directory).config
    trained = tmp_path / "draws-3"
    train_and_evaluate(config.replace(prior_codes="samples", prior_components=3), data, trained,
                       callbacks=[Checkpointer()])
    theirs = load_trained_model(trained).variables["prior"]["mixture"]
    mine = refit_prior(load_trained_model(directory), data, 3, "samples")
    assert mine.config.prior_codes == "samples" and mine.config.prior_components == 3
    mine = mine.variables["prior"]["mixture"]
    assert all(np.array_equal(np.asarray(theirs[k]), np.asarray(mine[k])) for k in theirs)
    means = refit_prior(load_trained_model(directory), data, 3, "means")
    assert not np.array_equal(np.asarray(means.variables["prior"]["mixture"]["means"]),
                              np.asarray(mine["means"]))


def test_the_refit_refuses_a_run_without_a_fitted_mixture(trained_run):
    with pytest.raises(ValueError, match="--prior mixture"):
        refit_prior(load_trained_model(trained_run.directory), trained_run.data, 2)


def test_each_setting_is_scored_as_cvae_eval_scores_its_samples(mixture_run):
    directory, data = mixture_run
    classifier = fidelity.load_or_train_classifier(data, None, epochs=1, log=lambda _: None)
    _, reference = classifier.logits_and_features(data.test_images[1::2])
    scored = sweep(str(directory), data, classifier, reference, components=(2, 3),
                   temperatures=(1.0,), sharpnesses=(1.3,), draws=2, per_digit=6)
    assert list(scored) == [(2, 1.0, 1.3, 1.0), (3, 1.0, 1.3, 1.0)]
    assert all(len(draws) == 2 for draws in scored.values())
    checkpoint = load_trained_model(directory)
    for seed in (0, 1):
        theirs = sample_scores(checkpoint, classifier, reference_features=reference,
                               reference_labels=np.asarray(data.test_labels)[1::2],
                               options=EvalOptions(samples_per_digit=6, seed=seed))
        assert {k: theirs[k] for k in COLUMNS} == scored[(2, 1.0, 1.3, 1.0)][seed]
    assert scored[(3, 1.0, 1.3, 1.0)] != scored[(2, 1.0, 1.3, 1.0)]


def test_a_truncation_is_scored_as_cvae_eval_scores_a_run_that_truncates(mixture_run):
    directory, data = mixture_run
    classifier = fidelity.load_or_train_classifier(data, None, epochs=1, log=lambda _: None)
    _, reference = classifier.logits_and_features(data.test_images[1::2])
    scored = sweep(str(directory), data, classifier, reference, components=(2,),
                   temperatures=(1.0,), sharpnesses=(1.3,), truncations=(0.5,), draws=1,
                   per_digit=6)
    checkpoint = load_trained_model(directory)
    truncated = dataclasses.replace(checkpoint, config=checkpoint.config.replace(truncation=0.5))
    theirs = sample_scores(truncated, classifier, reference_features=reference,
                           reference_labels=np.asarray(data.test_labels)[1::2],
                           options=EvalOptions(samples_per_digit=6, seed=0))
    assert {k: theirs[k] for k in COLUMNS} == scored[(2, 1.0, 1.3, 0.5)][0]
    plain = sample_scores(checkpoint, classifier, reference_features=reference,
                          reference_labels=np.asarray(data.test_labels)[1::2],
                          options=EvalOptions(samples_per_digit=6, seed=0))
    assert plain["fd"] != theirs["fd"]


def test_a_weight_power_reweights_the_components_and_keeps_everything_else(mixture_run,
                                                                           trained_run):
    directory, data = mixture_run
    checkpoint = load_trained_model(directory)
    assert with_weight_power(checkpoint, 1.0) is checkpoint
    mixture = checkpoint.variables["prior"]["mixture"]
    squared = with_weight_power(checkpoint, 2.0).variables["prior"]["mixture"]
    weights = np.asarray(mixture["weights"], np.float64)
    expected = weights ** 2 / (weights ** 2).sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(squared["weights"]), expected, rtol=1e-6)
    assert all(np.array_equal(np.asarray(mixture[k]), np.asarray(squared[k]))
               for k in mixture if k != "weights")
    with pytest.raises(ValueError, match="power > 0"):
        with_weight_power(checkpoint, 0.0)
    with pytest.raises(ValueError, match="mixture prior"):  # the standard prior has no weights
        with_weight_power(load_trained_model(trained_run.directory), 2.0)


def test_a_weight_power_applies_to_the_refitted_mixture(mixture_run):
    """A sweep at another number of components and a weight power scores what `cvae eval`
    scores for the refitted mixture with its weights raised to that power."""
    directory, data = mixture_run
    classifier = fidelity.load_or_train_classifier(data, None, epochs=1, log=lambda _: None)
    _, reference = classifier.logits_and_features(data.test_images[1::2])
    dials = dict(components=(3,), temperatures=(1.0,), sharpnesses=(1.3,), draws=1,
                 per_digit=6)
    plain = sweep(str(directory), data, classifier, reference, **dials)
    squared = sweep(str(directory), data, classifier, reference, weight_power=2.0, **dials)
    checkpoint = load_trained_model(directory)
    setting = (3, 1.0, 1.3, checkpoint.config.truncation)
    expected = rendered_at(with_weight_power(refit_prior(checkpoint, data, 3), 2.0), 1.3)
    theirs = sample_scores(expected, classifier, reference_features=reference,
                           reference_labels=np.asarray(data.test_labels)[1::2],
                           options=EvalOptions(samples_per_digit=6, seed=0))
    assert squared[setting][0] == {k: theirs[k] for k in COLUMNS}
    assert squared[setting] != plain[setting]


def test_dropping_the_doubtful_leaves_out_the_centres_the_decoder_doubts_most(mixture_run):
    directory, data = mixture_run
    checkpoint = refit_prior(load_trained_model(directory), data, 3)
    assert without_doubtful(checkpoint, 0) is checkpoint
    doubt = centre_doubt(checkpoint)
    assert doubt.shape == (10, 3) and np.all(doubt > 0)
    mixture = checkpoint.variables["prior"]["mixture"]
    dropped = without_doubtful(checkpoint, 1).variables["prior"]["mixture"]
    weights, kept = np.asarray(mixture["weights"], np.float64), np.asarray(dropped["weights"])
    worst = np.argmax(doubt, axis=1)
    assert np.all(kept[np.arange(10), worst] == 0)
    others = np.ones_like(weights, bool)
    others[np.arange(10), worst] = False
    expected = np.where(others, weights, 0) / np.where(others, weights, 0).sum(-1, keepdims=True)
    np.testing.assert_allclose(kept, expected, rtol=1e-6)
    assert all(np.array_equal(np.asarray(mixture[k]), np.asarray(dropped[k]))
               for k in mixture if k != "weights")
    with pytest.raises(ValueError, match="fewer than the 3"):
        without_doubtful(checkpoint, 3)


def test_a_sweep_that_drops_the_doubtful_scores_what_cvae_eval_scores_without_them(mixture_run):
    directory, data = mixture_run
    classifier = fidelity.load_or_train_classifier(data, None, epochs=1, log=lambda _: None)
    _, reference = classifier.logits_and_features(data.test_images[1::2])
    dials = dict(components=(3,), temperatures=(1.0,), sharpnesses=(1.3,), draws=1,
                 per_digit=6)
    swept = sweep(str(directory), data, classifier, reference, drop_doubtful=1, **dials)
    checkpoint = load_trained_model(directory)
    expected = rendered_at(without_doubtful(refit_prior(checkpoint, data, 3), 1), 1.3)
    theirs = sample_scores(expected, classifier, reference_features=reference,
                           reference_labels=np.asarray(data.test_labels)[1::2],
                           options=EvalOptions(samples_per_digit=6, seed=0))
    assert swept[(3, 1.0, 1.3, checkpoint.config.truncation)][0] == {k: theirs[k]
                                                                     for k in COLUMNS}
