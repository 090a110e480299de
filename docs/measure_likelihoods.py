"""The likelihood choice, measured (docs/model.md, "Which likelihood"): a short run of each
pixel likelihood on scikit-learn's 8x8 digits (1,797 real images of 17 grey levels, shipped in
the scikit-learn wheel), scored by `cvae eval`'s figures on a held-out test set.

    PYTHONPATH=. python docs/measure_likelihoods.py OUT_DIR [--epochs N]

writes OUT_DIR/likelihoods.json (each run's bits/dim and sample fidelity) and
OUT_DIR/samples-<likelihood>.png (one row per digit). The 8x8 set is registered in this
process only; the images are the levels v * 255 / 16 of scikit-learn's v in 0..16.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from cvae.data import specs
from cvae.data.load import Dataset

SPEC = specs.DatasetSpec("sklearn_digits", "scikit-learn digits", "sklearn_digits", 8, 8, 1,
                         specs.DIGITS, source=None)
TEST_SIZE = 297  # the last 297 of a seeded permutation: 1,500 left to train on
LIKELIHOODS = ("bernoulli", "logistic")


def digits_dataset(seed: int = 0) -> Dataset:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.round(digits.images * 255 / 16).astype(np.uint8)
    order = np.random.default_rng(seed).permutation(len(images))
    train, test = order[:-TEST_SIZE], order[-TEST_SIZE:]
    labels = digits.target.astype(np.int32)
    return Dataset(images[train], labels[train], images[test], labels[test], SPEC.name)


def measure(likelihood: str, data: Dataset, out: Path, *, epochs: int) -> dict:
    import jax

    from cvae.config import presets
    from cvae.evaluation.run import EvalOptions, evaluate_checkpoint
    from cvae.model.registry import create_model
    from cvae.model.store import load_trained_model
    from cvae.sampling.grid import make_grid, save_png
    from cvae.sampling.sampler import create_decode_fn
    from cvae.training.callbacks import Checkpointer
    from cvae.training.loop import train_and_evaluate

    config = presets.default().replace(
        dataset=SPEC.name, likelihood=likelihood, hidden_sizes=(256, 128), latent_dim=8,
        batch_size=64, epochs=epochs, warmup_steps=100, eval_every=epochs, validation_size=100,
        prior_components=5).validate()
    run_dir = out / likelihood
    train_and_evaluate(config, data, run_dir, callbacks=[Checkpointer()])
    checkpoint = load_trained_model(run_dir)
    results = evaluate_checkpoint(checkpoint, data, EvalOptions(iwae_k=200, samples_per_digit=100),
                                  classifier_dir=None)
    model = create_model(config)
    labels = np.repeat(np.arange(10, dtype=np.int32), 10)
    noise = np.asarray(jax.random.normal(jax.random.key(0), (100, model.noise_dim)))
    samples = np.asarray(create_decode_fn(model, config)(checkpoint.variables, noise, labels))
    save_png(make_grid(samples, 10, scale=4, image_shape=SPEC.stored_shape),
             out / f"samples-{likelihood}.png")
    fid = results["fidelity"]
    return {"neg_elbo_bits_per_dim": results["elbo"]["bits_per_dim"],
            "iwae_bits_per_dim": results["iwae"]["bits_per_dim_conditional"],
            "iwae_nats": results["iwae"]["nll_conditional"],
            "scored_data": results["iwae"]["binarization"],
            "sample_accuracy": fid["samples"]["accuracy"], "sample_fd": fid["samples"]["fd"],
            "real_fd": fid["real"]["fd"], "classifier_test_accuracy":
                fid["classifier"]["test_accuracy"],
            "sample_grey_share": fid["samples"]["grey_share"],
            "real_grey_share": fid["real"]["grey_share"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--epochs", type=int, default=60)
    args = parser.parse_args(argv)
    specs.register(SPEC)
    args.out.mkdir(parents=True, exist_ok=True)
    data = digits_dataset()
    figures = {likelihood: measure(likelihood, data, args.out, epochs=args.epochs)
               for likelihood in LIKELIHOODS}
    (args.out / "likelihoods.json").write_text(json.dumps(figures, indent=2) + "\n")
    json.dump(figures, sys.stdout, indent=2)


if __name__ == "__main__":
    main()
