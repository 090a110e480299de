"""The sampler's dials on trained checkpoints: the fitted mixture's components a class, the
temperature, the pixel sharpness and the truncation, each setting scored over several draws of
the samples; and, for every setting of a call, the mixture's component weights raised to a
power and renormalised (`--weight-power`: above 1 the common components are drawn more often,
below 1 the rare ones); and the K components of each class whose centres the decoder draws with
the most doubt left out (`--drop-doubtful K`: doubt is the centre's pixel entropy per unit of
ink, the score of a smeared or doubled digit).

    python -m bench.sampler_dials --checkpoint-dirs A,B,C [--components 10,30,100]
        [--codes means|samples] [--temperatures 1] [--sharpness 1.3] [--truncations 0.75,1]
        [--weight-power 1] [--drop-doubtful 0] [--draws 3] [--data-dir data] [--json FILE]
        [--out FILE.md]

None of these dials changes what a model learnt. The mixture is refitted as training's last fit
made it (`refit_prior`: the codes of the same training digits, the same key), with another
number of components or to the other codes (`--prior-codes`: posterior means or draws), so the
checkpoint's own setting reproduces its mixture bit for bit. Each
setting's samples are `cvae eval`'s (5,000 in the test labels' proportions), drawn with sample
seeds 0 .. draws - 1 and scored by the same classifier against the same reference half. One
draw's FD moves by as much as 0.4 with the sample seed alone (docs/model.md), so the table
gives, for each setting, the median over the checkpoints of each checkpoint's mean over its draws.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
from pathlib import Path

import jax
import numpy as np
from scipy import special

from cvae.cli_types import bounded
from cvae.config import NUM_CLASSES
from cvae.data.load import load_dataset
from cvae.data.splits import split_training_set
from cvae.evaluation import fidelity
from cvae.evaluation.run import EvalOptions, eval_sampler, eval_samples, rendered_at
from cvae.model import prior as prior_lib
from cvae.model.networks import create_model, pixel_means
from cvae.model.store import TrainedModel, load_trained_model
from cvae.training.loop import planned_steps
from cvae.training.step import device_arrays, prior_fit_key, run_key

COLUMNS = ("accuracy", "fd", "precision", "recall")


def refit_prior(checkpoint: TrainedModel, data, components: int,
                codes: str | None = None) -> TrainedModel:
    """The checkpoint with its mixture prior fitted again as training's last fit did, with
    `components` a class, to `codes` ("means" or "samples"; None: the run's own): a model
    trained with every label, on `data`'s training file."""
    config = checkpoint.config.replace(prior_codes=codes or checkpoint.config.prior_codes)
    if config.prior != "mixture" or config.labelled_count is not None:
        raise ValueError("refit_prior: a model trained with every label and --prior mixture")
    split = split_training_set(data.train_images, data.train_labels, config)
    steps_per_epoch, _ = planned_steps(config, len(split.train_labels), config.batch_size)
    last_epoch = checkpoint.step // steps_per_epoch - 1
    model = create_model(config)
    fit_fn = prior_lib.create_fit_fn(
        lambda variables, x, y: model.apply(variables, x, y, method="encode"),
        components=components, codes=config.prior_codes)
    images, labels = device_arrays(split.train_images, split.train_labels)
    mixture = fit_fn(checkpoint.variables, images, labels,
                     *prior_lib.class_index_table(split.train_labels, NUM_CLASSES),
                     prior_fit_key(run_key(config.seed), last_epoch))
    return dataclasses.replace(
        checkpoint, config=config.replace(prior_components=components),
        variables={**checkpoint.variables,
                   prior_lib.COLLECTION: {prior_lib.VARIABLE: jax.device_get(mixture)}})


def with_weight_power(checkpoint: TrainedModel, power: float) -> TrainedModel:
    """The checkpoint with its mixture's component weights w replaced by w^power / sum(w^power)
    in each class (power 1: the checkpoint itself)."""
    if power == 1:
        return checkpoint
    if power <= 0 or prior_lib.COLLECTION not in checkpoint.variables:
        raise ValueError("with_weight_power: a power > 0, on a checkpoint with a mixture prior")
    return with_weights(checkpoint, mixture_weights(checkpoint) ** power)


def mixture_weights(checkpoint: TrainedModel) -> np.ndarray:
    """f64[10, C]: the checkpoint's mixture component weights."""
    mixture = checkpoint.variables[prior_lib.COLLECTION][prior_lib.VARIABLE]
    return np.array(jax.device_get(mixture["weights"]), np.float64)


def with_weights(checkpoint: TrainedModel, weights: np.ndarray) -> TrainedModel:
    """The checkpoint with its mixture's component weights replaced by `weights` f64[10, C],
    renormalised in each class; the means and covariances as they are."""
    mixture = dict(jax.device_get(checkpoint.variables[prior_lib.COLLECTION][prior_lib.VARIABLE]))
    mixture["weights"] = (weights / weights.sum(-1, keepdims=True)).astype(np.float32)
    return dataclasses.replace(checkpoint, variables={
        **checkpoint.variables, prior_lib.COLLECTION: {prior_lib.VARIABLE: mixture}})


def centre_doubt(checkpoint: TrainedModel) -> np.ndarray:
    """f64[10, C]: how much the decoder doubts each mixture component's centre, decoded with
    its class: the summed pixel entropy of its means (nats) per unit of ink (their sum)."""
    mixture = checkpoint.variables[prior_lib.COLLECTION][prior_lib.VARIABLE]
    means = np.asarray(mixture["means"])
    classes, components, width = means.shape
    labels = np.repeat(np.arange(classes, dtype=np.int32), components)
    logits = create_model(checkpoint.config).apply(
        checkpoint.variables, means.reshape(-1, width), labels, method="decode")
    p = np.asarray(pixel_means(logits), np.float64)
    entropy = -(special.xlogy(p, p) + special.xlogy(1 - p, 1 - p)).sum(-1)
    return (entropy / p.sum(-1)).reshape(classes, components)


def without_doubtful(checkpoint: TrainedModel, count: int) -> TrainedModel:
    """The checkpoint with the `count` components of each class that `centre_doubt` scores
    highest given weight 0, the others' weights renormalised (0: the checkpoint itself)."""
    if count == 0:
        return checkpoint
    weights = mixture_weights(checkpoint)
    if not 0 < count < weights.shape[1]:
        raise ValueError(f"without_doubtful: leave out fewer than the {weights.shape[1]} "
                         "components a class")
    doubtful = np.argsort(centre_doubt(checkpoint), axis=1)[:, -count:]
    np.put_along_axis(weights, doubtful, 0.0, axis=1)
    return with_weights(checkpoint, weights)


def sweep(checkpoint_dir: str, data, classifier, reference, *, components, temperatures,
          sharpnesses, draws: int, codes: str | None = None, truncations=(None,),
          weight_power: float = 1.0, drop_doubtful: int = 0, per_digit: int = 500) -> dict:
    """{(components, temperature, sharpness, truncation): [one dict of COLUMNS per draw]} for
    one run, its mixture fitted to `codes`, its weights raised to `weight_power`, its
    `drop_doubtful` most doubtful components a class left out, and drawn at each truncation
    (None: as it was)."""
    checkpoint = load_trained_model(checkpoint_dir)
    reference_labels = np.asarray(data.test_labels)[1::2]
    scored = {}
    for c in components:
        own = (c == checkpoint.config.prior_components
               and codes in (None, checkpoint.config.prior_codes))
        refitted = without_doubtful(with_weight_power(
            checkpoint if own else refit_prior(checkpoint, data, c, codes), weight_power),
            drop_doubtful)
        for s, q in itertools.product(sharpnesses, truncations):
            q = checkpoint.config.truncation if q is None else q
            rendered = rendered_at(refitted, s, q)
            sampler = eval_sampler(rendered)
            for t, seed in itertools.product(temperatures, range(draws)):
                images, labels, _ = eval_samples(
                    sampler, reference_labels,
                    EvalOptions(samples_per_digit=per_digit, seed=seed), temperature=t)
                scores = fidelity.score_images(classifier, images, labels,
                                               reference_features=reference,
                                               reference_labels=reference_labels)
                scored.setdefault((c, t, s, q), []).append({k: scores[k] for k in COLUMNS})
                print(f"{checkpoint_dir} components {c} temperature {t:g} sharpness {s:g} "
                      f"truncation {q:g} draw {seed}: accuracy {scores['accuracy']:.4f}, "
                      f"fd {scores['fd']:.4f}, recall {scores['recall']:.4f}", flush=True)
    return scored


def table(results: dict) -> str:
    """Each setting's median over the runs of each run's mean over its draws."""
    lines = ["| components | temperature | sharpness | truncation | " + " | ".join(COLUMNS)
             + " |", "|---:|---:|---:|---:|" + "---:|" * len(COLUMNS)]
    for setting in next(iter(results.values())):
        medians = [statistics.median(statistics.mean(draw[k] for draw in run[setting])
                                     for run in results.values()) for k in COLUMNS]
        lines.append("| {} | {:g} | {:g} | {:g} | ".format(*setting)
                     + " | ".join(f"{m:.4f}" for m in medians) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint-dirs", required=True, help="comma-separated run folders")
    parser.add_argument("--components", default="10")
    parser.add_argument("--codes", choices=("means", "samples"),
                        help="refit the mixture to these codes (default: the run's own)")
    parser.add_argument("--temperatures", default="1")
    parser.add_argument("--sharpness", default="1.3")
    parser.add_argument("--truncations",
                        help="quantiles of N(0, I)'s radius (`--truncation`; 1 = none; "
                             "default: the run's own)")
    parser.add_argument("--weight-power", type=bounded(float, 0, None, low_open=True), default=1.0,
                        help="raise the mixture's component weights to this power (renormalised)")
    parser.add_argument("--drop-doubtful", type=bounded(int, 0, None), default=0,
                        help="leave out the K components a class whose centres the decoder "
                             "doubts most")
    parser.add_argument("--draws", type=int, default=3, help="sample seeds 0 .. draws - 1")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--json")
    parser.add_argument("--out")
    args = parser.parse_args()
    data = load_dataset(args.data_dir, "mnist")
    classifier = fidelity.load_or_train_classifier(data, str(Path(args.data_dir) / "classifier"))
    _, reference = classifier.logits_and_features(data.test_images[1::2])
    dials = {"components": [int(c) for c in args.components.split(",")],
             "temperatures": [float(t) for t in args.temperatures.split(",")],
             "sharpnesses": [float(s) for s in args.sharpness.split(",")],
             "truncations": ([float(q) for q in args.truncations.split(",")]
                             if args.truncations else [None])}
    results = {d: sweep(d, data, classifier, reference, draws=args.draws, codes=args.codes,
                        weight_power=args.weight_power, drop_doubtful=args.drop_doubtful,
                        **dials)
               for d in args.checkpoint_dirs.split(",") if d}
    text = table(results) + (f"\nComponent weights raised to the power {args.weight_power:g}."
                             "\n" if args.weight_power != 1 else "") + (
        f"\nThe {args.drop_doubtful} most doubtful components a class left out.\n"
        if args.drop_doubtful else "")
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        suffix = (f" weight power {args.weight_power:g}" if args.weight_power != 1 else "") + (
            f" drop doubtful {args.drop_doubtful}" if args.drop_doubtful else "")
        Path(args.json).write_text(json.dumps({d: {"{} {:g} {:g} {:g}".format(*k) + suffix: v
                                                   for k, v in r.items()}
                                               for d, r in results.items()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
