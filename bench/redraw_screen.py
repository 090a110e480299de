"""Would the sampler draw fewer malformed digits if it redrew the samples its own model doubts?
A screen: each of `cvae eval`'s sample slots drawn C times (sample seeds 0 .. C - 1), the
candidate the model scores best kept, and the kept samples scored as `cvae eval` scores them.

    python -m bench.redraw_screen --checkpoint-dirs A,B,C [--candidates 4]
        [--scores elbo,entropy,bayes,cycle] [--truncation Q] [--data-dir data] [--json FILE]

The scores are the model's own, lower is better, each computed on the image as drawn (rendered
at the run's pixel sharpness; the encoder and the classifier read it as 8-bit pixels, as the
service does): "elbo", its -ELBO under the asked label (`Sampler.encode`); "entropy", its
pixel entropy in nats, the rendered share of the decoder's doubt; "bayes", -log p(asked label |
image) by the model's reading of it (`Sampler.classify`: Bayes' rule for a model trained with
every label); "cycle", -log q(z | image, label) of the code that drew it, high where a code
decodes to an image that the encoder puts elsewhere. The first candidate is `cvae eval`'s own
draw, so one candidate scores as `cvae eval` does.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from cvae.cli_types import add_truncation_flag, bounded
from cvae.config import NUM_CLASSES
from cvae.data.load import load_dataset
from cvae.evaluation import fidelity
from cvae.evaluation.run import EvalOptions, eval_sampler, eval_samples, rendered_at
from cvae.limits import DEFAULT_TEMPERATURE
from cvae.model.store import load_trained_model
from cvae.sampling.sampler import request_latents

SCORES = ("elbo", "entropy", "bayes", "cycle")
COLUMNS = ("accuracy", "fd", "precision", "recall")


def image_scores(sampler, images: np.ndarray, labels: np.ndarray, *, seed: int,
                 names=SCORES) -> dict[str, np.ndarray]:
    """The scores `names` of images f32[N, 28, 28] that `eval_samples` drew at `seed` (its
    labels i64[N], digit-major): f32[N] each."""
    u8 = np.round(images * 255).astype(np.uint8)
    mean, logvar, neg_elbo = sampler.encode(u8, labels)
    scores = {"elbo": lambda: neg_elbo}

    def entropy():
        p = np.clip(images.reshape(len(images), -1), 1e-6, 1 - 1e-6)
        return -(p * np.log(p) + (1 - p) * np.log1p(-p)).sum(-1)

    def bayes():
        return -np.log(sampler.classify(u8)[np.arange(len(labels)), labels] + 1e-12)

    def cycle():
        counts = np.bincount(labels, minlength=NUM_CLASSES)
        noise = np.concatenate([
            request_latents(seed, (digit,), int(n), latent_dim=sampler.noise_dim,
                            temperature=DEFAULT_TEMPERATURE)[0]
            for digit, n in enumerate(counts) if n])
        z = sampler.to_codes(noise, labels.astype(np.int32))
        return 0.5 * (np.square(z - mean) / np.exp(logvar) + logvar
                      + np.log(2 * np.pi)).sum(-1)

    scores.update(entropy=entropy, bayes=bayes, cycle=cycle)
    return {name: scores[name]() for name in names}


def candidates(sampler, reference_labels: np.ndarray, count: int, *, names=SCORES,
               per_digit: int = 500):
    """`count` draws of `cvae eval`'s samples: (images f32[C, N, 28, 28], labels i64[N],
    {score: f32[C, N]} for the scores `names`)."""
    drawn, scores = [], {name: [] for name in names}
    for seed in range(count):
        images, labels, _ = eval_samples(sampler, reference_labels,
                                         EvalOptions(samples_per_digit=per_digit, seed=seed))
        drawn.append(images)
        for name, value in image_scores(sampler, images, labels, seed=seed,
                                        names=names).items():
            scores[name].append(value)
    return np.stack(drawn), labels, {name: np.stack(v) for name, v in scores.items()}


def best_of(images: np.ndarray, score: np.ndarray) -> np.ndarray:
    """For each slot, the candidate with the lowest score (the first on ties)."""
    return images[score.argmin(0), np.arange(images.shape[1])]


def screen(checkpoint_dir: str, data, classifier, reference, *, count: int,
           scores=SCORES, truncation: float | None = None, per_digit: int = 500) -> dict:
    """{"one draw": COLUMNS, score: COLUMNS for the best of `count` by that score}, drawn at
    `truncation` (None: the run's own)."""
    sampler = eval_sampler(rendered_at(load_trained_model(checkpoint_dir), None, truncation))
    reference_labels = np.asarray(data.test_labels)[1::2]
    images, labels, scored = candidates(sampler, reference_labels, count, names=scores,
                                        per_digit=per_digit)

    def columns(chosen):
        result = fidelity.score_images(classifier, chosen, labels, reference_features=reference,
                                       reference_labels=reference_labels)
        return {k: result[k] for k in COLUMNS}

    rows = {"one draw": columns(images[0])}
    for name in scores:
        rows[name] = columns(best_of(images, scored[name]))
        print(checkpoint_dir, name, rows[name], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint-dirs", required=True, help="comma-separated run folders")
    parser.add_argument("--candidates", type=bounded(int, 1, 64), default=4,
                        help="draws of each sample slot, sample seeds 0 .. C - 1 (default 4)")
    parser.add_argument("--scores", default=",".join(SCORES),
                        help=f"comma-separated, each kept by its own row (default: all of "
                             f"{', '.join(SCORES)})")
    add_truncation_flag(parser)
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--json")
    args = parser.parse_args()
    scores = args.scores.split(",")
    if unknown := set(scores) - set(SCORES):
        parser.error(f"unknown scores {sorted(unknown)}; choose from {', '.join(SCORES)}")
    data = load_dataset(args.data_dir, "mnist")
    classifier = fidelity.load_or_train_classifier(data, str(Path(args.data_dir) / "classifier"))
    _, reference = classifier.logits_and_features(data.test_images[1::2])
    runs = {d: screen(d, data, classifier, reference, count=args.candidates, scores=scores,
                      truncation=args.truncation)
            for d in args.checkpoint_dirs.split(",") if d}
    print(f"| best of {args.candidates} by | " + " | ".join(COLUMNS) + " |")
    print("|---|" + "---:|" * len(COLUMNS))
    for row in next(iter(runs.values())):
        medians = [statistics.median(run[row][k] for run in runs.values()) for k in COLUMNS]
        print(f"| {row} | " + " | ".join(f"{m:.4f}" for m in medians) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2, default=float) + "\n")


if __name__ == "__main__":
    main()
