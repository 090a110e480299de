"""Would the sampler draw fewer malformed digits if it redrew the samples its own model doubts?
A screen: each of `cvae eval`'s sample slots drawn C times (sample seeds 0 .. C - 1), the
candidate the model scores best kept, and the kept samples scored as `cvae eval` scores them.

    python -m bench.redraw_screen --checkpoint-dirs A,B,C [--candidates 4]
        [--scores elbo,entropy,bayes,cycle] [--truncation Q] [--data-dir data] [--json FILE]

The scores are the model's own, lower is better: "elbo", -ELBO of the drawn image under the
asked label (`Sampler.encode`); "entropy", the drawn image's pixel entropy (the decoder's
doubt, in nats); "bayes", -log p(asked label | image) by the model's Bayes' rule
(`Sampler.classify`); "cycle", -log q(z | image, label) of the code that drew it, high where a
code decodes to an image that the encoder puts elsewhere. One candidate (C = 1) is `cvae eval`'s
own draw.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from cvae.data.load import load_dataset
from cvae.evaluation import fidelity
from cvae.evaluation.run import EvalOptions, eval_samples
from cvae.sampling.sampler import load_sampler, request_latents

SCORES = ("elbo", "entropy", "bayes", "cycle")
COLUMNS = ("accuracy", "fd", "precision", "recall")


def image_scores(sampler, images: np.ndarray, labels: np.ndarray, *, seed: int,
                 counts: np.ndarray, names=SCORES) -> dict[str, np.ndarray]:
    """The scores `names` of images f32[N, 28, 28] drawn by `eval_samples` at `seed`: f32[N]."""
    u8 = np.round(images * 255).astype(np.uint8)
    mean, logvar, neg_elbo = sampler.encode(u8, labels)
    scores = {"elbo": lambda: neg_elbo}

    def entropy():
        p = np.clip(images.reshape(len(images), -1), 1e-6, 1 - 1e-6)
        return -(p * np.log(p) + (1 - p) * np.log1p(-p)).sum(-1)

    def bayes():
        return -np.log(sampler.classify(u8)[np.arange(len(labels)), labels] + 1e-12)

    def cycle():
        noise = np.concatenate([
            request_latents(seed, (digit,), int(n), latent_dim=sampler.noise_dim,
                            temperature=1.0)[0] for digit, n in enumerate(counts) if n])
        z = sampler.to_codes(noise, labels.astype(np.int32))
        return 0.5 * (np.square(z - mean) / np.exp(logvar) + logvar
                      + np.log(2 * np.pi)).sum(-1)

    scores.update(entropy=entropy, bayes=bayes, cycle=cycle)
    return {name: scores[name]() for name in names}


def candidates(sampler, reference_labels: np.ndarray, count: int, *, names=SCORES):
    """`count` draws of `cvae eval`'s samples: (images f32[C, N, 28, 28], labels i64[N],
    {score: f32[C, N]} for the scores `names`)."""
    drawn, scores = [], {name: [] for name in names}
    for seed in range(count):
        images, labels, counts = eval_samples(sampler, reference_labels, EvalOptions(seed=seed))
        drawn.append(images)
        scored = image_scores(sampler, images, labels, seed=seed, counts=counts, names=names)
        for name, value in scored.items():
            scores[name].append(value)
    return np.stack(drawn), labels, {name: np.stack(v) for name, v in scores.items()}


def best_of(images: np.ndarray, score: np.ndarray) -> np.ndarray:
    """For each slot, the candidate with the lowest score (the first on ties)."""
    return images[score.argmin(0), np.arange(images.shape[1])]


def screen(checkpoint_dir: str, data, classifier, reference, *, count: int,
           scores=SCORES, truncation: float | None = None) -> dict:
    """{"one draw": COLUMNS, score: COLUMNS for the best of `count` by that score}, drawn at
    `truncation` (None: the run's own)."""
    sampler = load_sampler(checkpoint_dir, block_rows=500, truncation=truncation)
    reference_labels = np.asarray(data.test_labels)[1::2]
    images, labels, scored = candidates(sampler, reference_labels, count, names=scores)

    def columns(chosen):
        result = fidelity.score_images(classifier, chosen, labels, reference_features=reference,
                                       reference_labels=reference_labels)
        return {k: float(result[k]) for k in COLUMNS}

    rows = {"one draw": columns(images[0])}
    for name in scores:
        rows[name] = columns(best_of(images, scored[name]))
        print(checkpoint_dir, name, rows[name], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint-dirs", required=True, help="comma-separated run folders")
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--scores", default=",".join(SCORES))
    parser.add_argument("--truncation", type=float, help="default: the run's own")
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
        Path(args.json).write_text(json.dumps(runs, indent=2) + "\n")


if __name__ == "__main__":
    main()
