"""Combinations `cvae train` once refused by name (cvae/model/levers.py's `check_trainable`,
deleted with the one objective path) now train: each runs a few steps of `train_and_evaluate`
on synthetic digits, through its own supervision, validation and prior, with finite figures;
and one of them resumes bit for bit."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from trees import tree_equal

from cvae.config import presets
from cvae.data.synthetic import synthetic_dataset
from cvae.training.callbacks import Callback, Checkpointer, NanGuard
from cvae.training.loop import train_and_evaluate

pytestmark = pytest.mark.slow  # `make test-slow`, not `make test` (docs/development.md)

BASE = presets.test()
LADDER = {"model": "ladder", "stochastic_layers": 2, "upper_latent_dim": 2}
FEW_LABELS = {"labels": "20", "labelled_per_batch": 4}

COMBINATIONS = {
    "m2-dreg": {"objective": "dreg", "importance_samples": 3, **FEW_LABELS},
    "m2-ladder-iwae": {"objective": "iwae", "importance_samples": 2, **LADDER, **FEW_LABELS},
    "ladder-conv": {"architecture": "conv", "hidden_sizes": (16,), **LADDER},
    "ladder-batch-norm-dropout": {"batch_norm": True, "dropout_rate": 0.2, **LADDER},
    "vamp-few-labels": {"prior": "vamp", "pseudo_inputs": 2, **FEW_LABELS},
    "learned-mixture-batch-norm": {"prior": "learned_mixture", "prior_components": 2,
                                   "batch_norm": True},
    "dreg-dropout": {"objective": "dreg", "importance_samples": 2, "dropout_rate": 0.2},
}


class Losses(Callback):
    """Every step's training figures, and the validation figures of every evaluation."""

    def __init__(self):
        self.steps, self.evaluations = [], []

    def on_step_end(self, run, metrics):
        self.steps.append({name: np.asarray(values) for name, values in metrics.items()})

    def on_eval_end(self, run, metrics):
        self.evaluations.append(metrics)


def assert_finite_figures(config, run, losses: Losses) -> None:
    """Every step's figures and the last validation's are finite; what the config adds (q(y|x),
    BatchNorm's statistics, a learned prior written as a mixture) is there."""
    assert run.stop_reason is None and run.step >= 3
    for name_ in ("loss", "reconstruction", "kl", "grad_norm"):
        values = np.concatenate([step[name_].reshape(-1) for step in losses.steps])
        assert len(values) == run.step and np.all(np.isfinite(values)), name_
    last = losses.evaluations[-1]
    assert all(np.isfinite(value) for value in last.values() if isinstance(value, float))
    if config.labels.labelled_count is not None:  # M2: q(y|x) is trained and read
        assert "classifier_error" in " ".join(last)
    if config.model.options.batch_norm:
        assert jax.tree.leaves(run.state.batch_stats)
    if config.prior.name in ("vamp", "learned_mixture"):  # written where a fitted mixture would be
        assert run.state.prior["mixture"]["means"].shape[:2] == (
            10, (config.prior.options.pseudo_inputs if config.prior.name == "vamp"
                 else config.prior.options.components))


# Trained (and checked as the others are) by the resume test below, which runs it anyway.
RESUMED = "ladder-batch-norm-dropout"


@pytest.mark.parametrize("name", sorted(set(COMBINATIONS) - {RESUMED}))
def test_a_once_refused_combination_trains_with_finite_figures(name, tmp_path):
    config = BASE.replace(**COMBINATIONS[name]).validate()
    losses = Losses()
    run = train_and_evaluate(config, synthetic_dataset(80), tmp_path,
                             callbacks=[NanGuard(), losses])
    assert_finite_figures(config, run, losses)


@pytest.mark.determinism
def test_a_ladder_with_batch_norm_and_dropout_resumes_bit_for_bit(tmp_path):
    """Dropout's masks come from the step's key and BatchNorm's statistics ride in the state:
    stopped mid-run and resumed, the run ends where the uninterrupted one does. The
    uninterrupted run is also this combination's finite-figures check (the test above's)."""
    config = BASE.replace(epochs=2, steps_per_call=3, **COMBINATIONS[RESUMED]).validate()
    data = synthetic_dataset(80)  # 4 steps an epoch: 8 in all
    losses = Losses()
    straight = train_and_evaluate(config, data, tmp_path / "straight",
                                  callbacks=[NanGuard(), losses, Checkpointer()])
    assert_finite_figures(config, straight, losses)
    stopped = train_and_evaluate(config.replace(max_steps=5), data, tmp_path / "resumed",
                                 callbacks=[Checkpointer()])
    assert stopped.step == 5
    resumed = train_and_evaluate(config, data, tmp_path / "resumed", callbacks=[Checkpointer()])
    assert resumed.start_step == 5 and resumed.step == straight.step == 8
    for part in ("params", "opt_state", "batch_stats"):
        assert tree_equal(jax.device_get(getattr(straight.state, part)),
                          jax.device_get(getattr(resumed.state, part))), part
