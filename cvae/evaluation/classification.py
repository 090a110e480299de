"""How well a model trained with few labels (`--labels N`) reads digits: `cvae eval`'s figures.

- q(y|x): the test error of the classifier learnt beside the encoder (the paper's Table 1
  figure), through the sampler's fixed blocks as the service reads it.
- The generative classifier argmax_y p(x|y): each test digit, binarised once with a fixed seed,
  scored under every label by the IWAE bound with the same K samples for each label (unlike the
  marginal -log p(x), whose true-label column uses more samples), so no label is favoured.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from cvae.evaluation import iwae
from cvae.data.specs import DatasetSpec
from cvae.model.registry import create_model
from cvae.sampling.sampler import create_sampler
from cvae.data.specs import spec_of


def classifier_error(sampler, images_u8: np.ndarray, labels: np.ndarray) -> dict:
    """q(y|x)'s test error and mean probability of the true label."""
    probabilities = sampler.classify(images_u8)
    predicted = np.argmax(probabilities, axis=-1)
    return {"error": float(np.mean(predicted != labels)),
            "true_label_probability": float(np.mean(probabilities[np.arange(len(labels)),
                                                                  labels])),
            "error_per_digit": [float(np.mean(predicted[labels == d] != d))
                                for d in sampler.classes]}


def generative_error(model, variables, *, spec: DatasetSpec, images_u8: np.ndarray,
                     labels: np.ndarray, key: jax.Array, num_samples: int,
                     batch_size: int = 100) -> dict:
    """argmax_y log p(x|y) (IWAE, K = num_samples for every label of `spec`, the model's
    dataset's) against the true labels."""
    bound = iwae.create_iwae_fn(model, num_samples, chunk=min(num_samples, 100))
    binarize_key, sample_key = jax.random.split(key)
    predicted = []
    for i, start in enumerate(range(0, len(images_u8), batch_size)):
        rows = images_u8[start:start + batch_size].reshape(-1, spec.pixels)
        pad = batch_size - len(rows)
        x = iwae.scored_inputs(jax.random.fold_in(binarize_key, i),
                               np.pad(rows, ((0, pad), (0, 0))), model.likelihood.name)
        batch_key = jax.random.fold_in(sample_key, i)
        scores = np.stack([np.asarray(bound(variables, x, jnp.full((batch_size,), y, jnp.int32),
                                            batch_key)) for y in range(spec.num_classes)],
                           axis=1)
        predicted.append(np.argmax(scores[:len(rows)], axis=1))
    predicted = np.concatenate(predicted)
    return {"error": float(np.mean(predicted != labels)), "k": num_samples}


def classification_metrics(checkpoint, images_u8: np.ndarray, labels: np.ndarray,
                           *, num_samples: int, seed: int) -> dict:
    """Both classifiers' test errors for a checkpoint with a classifier (else {})."""
    config = checkpoint.config
    model = create_model(config)
    if not model.has_classifier:
        return {}
    variables = checkpoint.variables
    sampler = create_sampler(model, config, variables, step=checkpoint.step, block_rows=500)
    result = {"labels": config.labels.labelled_count, "q_y_given_x": classifier_error(
        sampler, images_u8, labels)}
    if config.likelihood.component.bounded and num_samples > 0:
        result["generative"] = generative_error(model, variables, spec=spec_of(config.data.dataset),
                                                images_u8=images_u8, labels=labels,
                                                key=jax.random.key(seed), num_samples=num_samples)
    return {"classification": result}


def summary_lines(result: dict) -> list[str]:
    lines = [f"  q(y|x) test error ({result['labels']} labels){'':<6}"
             f"{100 * result['q_y_given_x']['error']:>8.2f} %"]
    if "generative" in result:
        lines.append(f"  argmax_y p(x|y) test error, K={result['generative']['k']:<8}"
                     f"{100 * result['generative']['error']:>6.2f} %")
    return lines
