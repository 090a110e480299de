"""Why `cvae eval` draws its samples in the test digits' label proportions, in figures.

    python -m bench.sample_labels [--checkpoints NAME=A,B,C ...] [--draws 5]
        [--data-dir data] [--json FILE] [--out FILE.md]

The reference that samples are compared with is the odd half of the test set: 5,000 digits
whose labels are not uniform (434 fives, 544 ones). A conditional model asked for 500 of each
digit draws p(x) under a uniform p(y), so its Fréchet distance carries the label mix's
difference as well as the model's. Measured here both ways, with `cvae eval`'s classifier and
reference half:
- a perfect model: real training digits, drawn (`--draws` times, without replacement) 500 a
  digit against the reference's label counts;
- each checkpoint's samples (`cvae eval`'s seed 0) drawn both ways: `--balanced-samples` and
  the default; a row is the median over a named group's checkpoints (e.g. a lever's seeds).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from cvae.data.load import load_dataset
from cvae.evaluation import fidelity
from cvae.evaluation.run import EvalOptions, eval_sampler, eval_samples, sample_counts
from cvae.model.store import load_trained_model

COLUMNS = ("accuracy", "fd", "precision", "recall")
WAYS = {"500 a digit": True, "the reference's label counts": False}


def real_digits(data, classifier, reference, reference_labels, draws: int) -> dict:
    """{way: [scores of each draw]}: training digits standing in for a perfect model."""
    labels = np.asarray(data.train_labels)
    counts_of = {way: sample_counts(reference_labels, EvalOptions(balanced_samples=balanced))
                 for way, balanced in WAYS.items()}
    scored = {way: [] for way in WAYS}
    for draw in range(draws):
        rng = np.random.default_rng(draw)
        for way, counts in counts_of.items():
            rows = np.concatenate([rng.choice(np.flatnonzero(labels == digit), n, replace=False)
                                   for digit, n in enumerate(counts)])
            scored[way].append(fidelity.score_images(
                classifier, data.train_images[rows], labels[rows],
                reference_features=reference, reference_labels=reference_labels))
    return scored


def model_samples(checkpoint_dir: str, classifier, reference, reference_labels) -> dict:
    """{way: scores} of one checkpoint's samples, as `cvae eval` draws them."""
    checkpoint = load_trained_model(checkpoint_dir)
    sampler = eval_sampler(checkpoint)
    scored = {}
    for way, balanced in WAYS.items():
        images, labels, _ = eval_samples(sampler, reference_labels,
                                         EvalOptions(balanced_samples=balanced))
        scored[way] = fidelity.score_images(classifier, images, labels,
                                            reference_features=reference,
                                            reference_labels=reference_labels)
        print(f"{checkpoint_dir}, {way}: " + ", ".join(f"{k} {scored[way][k]:.4f}"
                                                       for k in COLUMNS), flush=True)
    return scored


def table(rows: dict[str, dict[str, list[dict]]]) -> str:
    """One row a (source, way): the median of each column over its scores."""
    lines = ["| samples | drawn | n | " + " | ".join(COLUMNS) + " |",
             "|---|---|---:|" + "---:|" * len(COLUMNS)]
    for source, ways in rows.items():
        for way, scores in ways.items():
            medians = [statistics.median(s[k] for s in scores) for k in COLUMNS]
            lines.append(f"| {source} | {way} | {len(scores)} | "
                         + " | ".join(f"{m:.4f}" if k != "fd" else f"{m:.2f}"
                                      for k, m in zip(COLUMNS, medians)) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", action="append", default=[], metavar="NAME=A,B,C",
                        help="a named group of run folders (repeatable)")
    parser.add_argument("--draws", type=int, default=5)
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--json")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    data = load_dataset(args.data_dir, "mnist")
    classifier = fidelity.load_or_train_classifier(data, str(Path(args.data_dir) / "classifier"))
    reference_labels = np.asarray(data.test_labels)[1::2]
    _, reference = classifier.logits_and_features(data.test_images[1::2])
    rows = {"real training digits": real_digits(data, classifier, reference, reference_labels,
                                                args.draws)}
    per_checkpoint = {}
    for group in args.checkpoints:
        name, _, listed = group.partition("=")
        dirs = [d for d in listed.split(",") if d]
        scores = [model_samples(d, classifier, reference, reference_labels) for d in dirs]
        per_checkpoint.update(zip(dirs, scores))
        rows[name] = {way: [s[way] for s in scores] for way in WAYS}
    text = table(rows)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "real": {way: [{k: s[k] for k in COLUMNS} for s in scores]
                     for way, scores in rows["real training digits"].items()},
            "checkpoints": {d: {way: {k: s[k] for k in COLUMNS} for way, s in ways.items()}
                            for d, ways in per_checkpoint.items()}}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
