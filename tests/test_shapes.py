"""The models take their shape from the dataset's spec: height, width, 1 or 3 channels and 2 to
1,000 classes, through every family, architecture, prior, objective and likelihood. Each case
trains a few steps with the real loop (its validation and prior fit included), draws samples,
and scores the test images with the IWAE bounds, whose built-in check must pass. A conv stack
refuses a side it cannot halve twice, naming the sides it takes."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from shaped_data import register, shaped_dataset, shaped_images, shaped_spec

from cvae.config import presets
from cvae.errors import ConfigError
from cvae.evaluation.run import EvalOptions, elbo_metrics, iwae_metrics
from cvae.model.registry import create_model, init_variables
from cvae.model.store import TrainedModel
from cvae.sampling.functions import create_decode_fn
from cvae.training.callbacks import NanGuard
from cvae.training.loop import train_and_evaluate

pytestmark = pytest.mark.slow  # `make test-slow`, not `make test` (docs/development.md)

LADDER = {"model": "ladder", "stochastic_layers": 2, "upper_latent_dim": 2}
CONV = {"architecture": "conv", "hidden_sizes": (16,)}

# (height, width, channels, classes), config changes: together they cover both families,
# BatchNorm and dropout, every prior, every objective, M2 and both likelihoods of the data:
# three cases, not their product, as each costs seconds of compilation. The conv stack (whose
# training costs 15 CPU-seconds more a case) is shaped below, and trains in
# tests/test_model_combinations.py.
CASES = {
    "grey-6x10-1000-cvae-mlp-mixture-batch-norm-dropout": (
        (6, 10, 1, 1000), {"prior": "mixture", "prior_components": 10, "prior_codes": "means",
                           "batch_norm": True, "dropout_rate": 0.2}),
    "rgb-12x12-3-cvae-mlp-logistic-learned-mixture-m2-iwae": (
        (12, 12, 3, 3), {"likelihood": "logistic", "prior": "learned_mixture",
                         "prior_components": 2, "labels": "6", "labelled_per_batch": 4,
                         "objective": "iwae", "importance_samples": 2}),
    "rgb-12x16-2-ladder-mlp-logistic-vamp-dreg": (
        (12, 16, 3, 2), {**LADDER, "likelihood": "logistic", "prior": "vamp",
                         "pseudo_inputs": 2, "objective": "dreg", "importance_samples": 2}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_model_shaped_by_its_dataset_trains_samples_and_scores(name, monkeypatch, tmp_path):
    shape, changes = CASES[name]
    spec = register(monkeypatch, shaped_spec(name, *shape))
    config = presets.test().replace(dataset=spec.name, max_steps=2, steps_per_call=2,
                                    **changes).validate()
    data = shaped_dataset(spec, num_train=48)
    run = train_and_evaluate(config, data, tmp_path, callbacks=[NanGuard()])
    assert run.step == 2 and not run.non_finite
    model, variables = create_model(config), run.state.eval_variables()
    if config.prior.name != "standard":  # fitted or written where the sampler reads it
        assert variables["prior"]["mixture"]["means"].shape[0] == spec.num_classes

    labels = np.array([0, spec.num_classes - 1, 1], np.int32)
    noise = np.asarray(jax.random.normal(jax.random.key(0), (3, model.noise_dim)))
    samples = np.asarray(create_decode_fn(model, config)(variables, noise, labels))
    assert samples.shape == (3, *spec.stored_shape)
    assert np.all((samples >= 0) & (samples <= 1))

    # Scored as `cvae eval` scores a checkpoint: its ELBO terms and IWAE bounds, in nats and
    # bits per dimension (the marginal's built-in check raises if it fails).
    checkpoint = TrainedModel(run.step, config, variables, metrics={}, labelled={})
    images, test_labels = data.test_images[:4], data.test_labels[:4]
    elbo = elbo_metrics(checkpoint, images, test_labels)
    bound = iwae_metrics(checkpoint, images, test_labels,
                         options=EvalOptions(iwae_k=2, iwae_k_marginal=1, iwae_chunk=2))["iwae"]
    assert bound["marginal_check"]["ok"]
    assert len(bound["bayes_rule"]["error_per_digit"]) == spec.num_classes
    for nats, bits in ((elbo["neg_elbo"], elbo["bits_per_dim"]),
                       (bound["nll_conditional"], bound["bits_per_dim_conditional"]),
                       (bound["nll_marginal"], bound["bits_per_dim_marginal"])):
        assert np.isfinite(nats) and bits == nats / (spec.pixels * math.log(2.0)) > 0


def test_a_conv_stack_takes_any_sides_it_can_halve_channels_and_likelihood(monkeypatch):
    """One family: both build their head with `layers.pixel_logits`. (Building a conv model
    costs several CPU-seconds, most of it in its initialisation.)"""
    spec = register(monkeypatch, shaped_spec("wide", 12, 16, 3, 2))
    config = presets.test().replace(dataset="wide", likelihood="logistic", **CONV).validate()
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    images = jnp.asarray(shaped_images(spec, np.array([0, 1])).reshape(2, -1) / 255.0,
                         jnp.float32)
    labels = jnp.array([0, 1], jnp.int32)
    noise = jax.random.normal(jax.random.key(1), (2, model.noise_dim))
    outputs, terms = jax.jit(lambda v: (
        model.apply(v, noise, labels, method="generate"),
        model.apply(v, images, labels, noise[None], method="terms")))(variables)
    assert outputs.shape == (2, 2 * spec.pixels)  # a mean and a log-scale a value
    assert terms.log_px.shape == (1, 2) and np.all(np.isfinite(terms.log_px))


@pytest.mark.parametrize("family", [{}, LADDER], ids=["cvae", "ladder"])
def test_a_conv_stack_refuses_a_side_it_cannot_halve_naming_the_sides_it_takes(
        family, monkeypatch):
    spec = register(monkeypatch, shaped_spec("odd", 10, 12, 3, 4))
    config = presets.test().replace(dataset="odd", architecture="conv", **family).validate()
    with pytest.raises(ConfigError, match=r"odd's 10x12 images do not halve twice.*"
                                          r"multiples of 4 \(nearest: 8, 12;"):
        init_variables(create_model(config, spec), jax.random.key(0))
