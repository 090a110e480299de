"""`python -m bench.sharpness` scores each sharpness exactly as `cvae eval --pixel-sharpness`
does: the same samples, the same classifier and reference half, the same figures."""

from __future__ import annotations

import numpy as np

from bench.sharpness import COLUMNS, sweep
from cvae.data.synthetic import synthetic_dataset
from cvae.evaluation import fidelity
from cvae.evaluation.run import EvalOptions, rendered_at, sample_scores
from cvae.model.store import load_trained_model


def test_the_sweep_scores_each_sharpness_as_cvae_eval_does(trained_run):
    data = synthetic_dataset(num_train=512, num_test=64)
    classifier = fidelity.load_or_train_classifier(data, None, epochs=1, log=lambda _: None)
    _, reference = classifier.logits_and_features(data.test_images[1::2])
    scored = sweep(str(trained_run.directory), data, classifier, reference, (1.0, 3.0), 6)
    assert list(scored) == [1.0, 3.0] and all(list(s) == list(COLUMNS) for s in scored.values())
    assert scored[3.0]["grey_share"] < scored[1.0]["grey_share"]
    checkpoint = load_trained_model(trained_run.directory)
    for s in (1.0, 3.0):
        theirs = sample_scores(rendered_at(checkpoint, s), classifier,
                               reference_features=reference,
                               reference_labels=np.asarray(data.test_labels)[1::2],
                               options=EvalOptions(samples_per_digit=6))
        assert {k: theirs[k] for k in COLUMNS[:5]} == {k: scored[s][k] for k in COLUMNS[:5]}
