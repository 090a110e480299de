"""The pixel sharpness as a dial: trained checkpoints re-rendered at several sharpnesses.

    python -m bench.sharpness --checkpoint-dirs A,B,C [--sharpness 1,1.1,1.2,1.3,1.4]
        [--data-dir data] [--samples-per-digit 500] [--json FILE] [--out FILE.md]

Rendering never changes what a model learnt, so this needs no training: each checkpoint is
rendered at every sharpness s as `cvae eval --pixel-sharpness s` renders it
(`cvae.evaluation.run.rendered_at`), and its samples (`cvae eval`'s: 5,000 in the test labels'
proportions, seed 0) and its reconstructions of the even half of the test set are scored by the
same classifier against the same reference half, with their share of grey pixels beside the
real digits' (training and test): `cvae eval`'s figures, one checkpoint loaded once for every s.
The table gives the median over the checkpoints (e.g. the three seeds of a lever) of each figure.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from pathlib import Path

import numpy as np

from cvae.data.load import load_dataset
from cvae.evaluation import fidelity, reconstructions
from cvae.evaluation.run import EvalOptions, eval_sampler, eval_samples, rendered_at
from cvae.model.store import load_trained_model

COLUMNS = ("accuracy", "fd", "precision", "recall", "grey_share", "recon_fd", "recon_recall",
           "recon_grey_share")


def sweep(checkpoint_dir: str, data, classifier, reference, sharpnesses, per_digit: int) -> dict:
    """{s: {column: value}} for one checkpoint; `reference`: the odd half's features."""
    checkpoint = load_trained_model(checkpoint_dir)
    images, labels = data.test_images, np.asarray(data.test_labels)
    options = EvalOptions(samples_per_digit=per_digit)
    score = functools.partial(fidelity.score_images, classifier, reference_features=reference,
                              reference_labels=labels[1::2])
    scored = {}
    for s in sharpnesses:
        rendered = rendered_at(checkpoint, s)
        sampler = eval_sampler(rendered)
        mine = score(*eval_samples(sampler, labels[1::2], options)[:2])
        theirs = score(reconstructions.reconstruct(sampler, images[0::2], labels[0::2]),
                       labels[0::2])
        scored[s] = {**{k: mine[k] for k in COLUMNS[:5]}, "recon_fd": theirs["fd"],
                     "recon_recall": theirs["recall"], "recon_grey_share": theirs["grey_share"]}
        print(f"{checkpoint_dir} s={s}: " + ", ".join(f"{k} {v:.4f}" for k, v in
                                                       scored[s].items()), flush=True)
    return scored


def table(results: dict, real: dict) -> str:
    sharpnesses = next(iter(results.values())).keys()
    lines = [f"Real digits' share of grey pixels: training {real['train']:.4f}, "
             f"test {real['test']:.4f}.", "",
             "| sharpness | " + " | ".join(COLUMNS).replace("_", " ") + " |",
             "|---:|" + "---:|" * len(COLUMNS)]
    for s in sharpnesses:
        medians = [statistics.median(r[s][k] for r in results.values()) for k in COLUMNS]
        lines.append(f"| {s:g} | " + " | ".join(f"{m:.4f}" for m in medians) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint-dirs", required=True, help="comma-separated run folders")
    parser.add_argument("--sharpness", default="1,1.1,1.2,1.3,1.4")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--samples-per-digit", type=int, default=500)
    parser.add_argument("--json")
    parser.add_argument("--out")
    args = parser.parse_args()
    sharpnesses = [float(s) for s in args.sharpness.split(",")]
    dirs = [d for d in args.checkpoint_dirs.split(",") if d]
    data = load_dataset(args.data_dir, "mnist")
    classifier = fidelity.load_or_train_classifier(data, str(Path(args.data_dir) / "classifier"))
    real = {"train": fidelity.grey_share(data.train_images),
            "test": fidelity.grey_share(data.test_images)}
    _, reference = classifier.logits_and_features(data.test_images[1::2])
    results = {d: sweep(d, data, classifier, reference, sharpnesses, args.samples_per_digit)
               for d in dirs}
    text = table(results, real)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"real_grey_share": real, "runs": {
            d: {str(s): v for s, v in r.items()} for d, r in results.items()}}, indent=2) + "\n")


if __name__ == "__main__":
    main()
