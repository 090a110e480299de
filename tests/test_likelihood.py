"""The pixel likelihoods (cvae/model/densities.py): the discretised logistic is a distribution
over the 256 levels, the Bernoulli default trains to the same bits as before the likelihood
became a choice, and bits per dimension are nats / (H * W * C * ln 2).

The default's first losses were recorded by the code before the logistic existed, with

    PYTHONPATH=<that checkout> python tests/test_likelihood.py

which writes tests/fixtures/default-first-losses.json (the config and data are this file's).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "default-first-losses.json"
FIRST_STEPS = 3
LEVELS = np.arange(256)


def _level_masses(mean: float, log_scale: float) -> np.ndarray:
    from cvae.model.densities import discretized_logistic_log_mass

    targets = jnp.asarray(LEVELS / 255.0, jnp.float32)
    return np.exp(np.asarray(discretized_logistic_log_mass(
        targets, jnp.float32(mean), jnp.float32(log_scale)), np.float64))


@pytest.mark.parametrize("mean, log_scale", [(0.5, -3.0), (0.0, -5.0), (1.0, -2.0),
                                             (0.3, -9.0), (-2.0, 0.5), (0.77, 1.5)])
def test_the_logistic_masses_over_the_256_levels_sum_to_one(mean, log_scale):
    """Edge bins included; a scale below one bin, a mean outside [0, 1], a wide scale."""
    masses = _level_masses(mean, log_scale)
    assert np.all(masses >= 0)
    assert masses.sum() == pytest.approx(1.0, abs=1e-4)


def test_the_logistic_mass_of_a_level_is_its_bins_cdf_difference():
    mean, scale = 0.4, math.exp(-4.0)
    cdf = lambda v: 1.0 / (1.0 + np.exp(-(v - mean) / scale))  # noqa: E731
    level = 100
    expected = cdf((level + 0.5) / 255) - cdf((level - 0.5) / 255)
    assert _level_masses(mean, -4.0)[level] == pytest.approx(expected, rel=1e-4)
    assert _level_masses(mean, -4.0)[0] == pytest.approx(cdf(0.5 / 255), rel=1e-4)
    assert _level_masses(mean, -4.0)[255] == pytest.approx(1 - cdf(254.5 / 255), rel=1e-4)


def test_the_logistic_reconstruction_is_the_nats_of_the_levels_and_renders_its_means():
    from cvae.model.densities import (discretized_logistic_log_mass, pixel_means,
                                      reconstruction)

    rng = np.random.default_rng(0)
    targets = jnp.asarray(rng.integers(0, 256, (2, 5)) / 255.0, jnp.float32)
    outputs = jnp.asarray(rng.normal(size=(2, 10)), jnp.float32) * 0.5
    means, log_scales = outputs[:, :5], outputs[:, 5:]
    np.testing.assert_allclose(
        reconstruction(outputs, targets, "logistic"),
        -discretized_logistic_log_mass(targets, means, log_scales).sum(-1), rtol=1e-6)
    np.testing.assert_array_equal(pixel_means(outputs, 1.3, likelihood="logistic"),
                                  jnp.clip(means, 0, 1))


def test_bits_per_dimension_are_nats_over_values_times_ln_2():
    from cvae.model.densities import bits_per_dim

    assert bits_per_dim(784 * math.log(2.0), 784) == 1.0
    assert bits_per_dim(100.0, 8 * 8 * 3) == 100.0 / (192 * math.log(2.0))


def first_losses() -> list[float]:
    """The default config's first training losses on the synthetic digits, step by step."""
    from cvae.config.sections import Config
    from cvae.data.synthetic import synthetic_dataset
    from cvae.training.callbacks import Callback
    from cvae.training.loop import train_and_evaluate

    class Losses(Callback):
        values: list[float] = []

        def on_step_end(self, run, metrics):
            self.values.extend(np.asarray(metrics["loss"]).reshape(-1).tolist())

    import tempfile

    config = Config().replace(validation_size=16, max_steps=FIRST_STEPS)
    losses = Losses()
    with tempfile.TemporaryDirectory() as directory:
        train_and_evaluate(config, synthetic_dataset(FIRST_STEPS * config.run.batch_size + 16),
                           Path(directory), callbacks=[losses])
    return losses.values


def test_the_default_bernoulli_run_takes_the_same_first_steps_as_before():
    recorded = json.loads(FIXTURE.read_text())["losses"]
    got = first_losses()
    assert len(got) == FIRST_STEPS
    assert np.asarray(got, np.float32).tobytes() == np.asarray(recorded, np.float32).tobytes()


if __name__ == "__main__":
    losses = first_losses()
    FIXTURE.write_text(json.dumps({"config": f"Config().replace(validation_size=16, max_steps="
                                             f"{FIRST_STEPS}), synthetic_dataset("
                                             f"{FIRST_STEPS} * 128 + 16)",
                                   "jax": jax.__version__, "losses": losses}, indent=2) + "\n")
    print(f"wrote {FIXTURE}: {losses}", file=sys.stderr)
