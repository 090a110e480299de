"""A screen: the emoji (64x64 colour) with the chosen defaults and the convolutional encoder
and decoder (`--architecture conv`) for 34 epochs: what its step, timed at 2.44 s on a quiet
machine, fits in the 30 minutes the baseline `emoji`'s 26 epochs take.

    python -m experiments.run emoji_conv --seeds 0,1,2 --with-baseline

The emoji prepared first, as docs/own-images.md does: `npm pack emoji-datasource-google@16.0.0`,
`python scripts/example_datasets.py emoji emoji`, then `cvae data --from emoji --name emoji`.

On 64x64 colour the MLP's output layer holds about 100 million weights, and its step timed at
3.14 s against the conv model's 2.44 s (2-core Intel Xeon, a minute apart): whether the conv
model, with more epochs in the same time and spatial structure, draws emoji nearer the real
ones than the MLP.

Measured 2026-12-01 on the 2-core Intel Xeon (AVX-512, AMX), seed 0, alone: 1,759 s; in recipe
v2's features (real halves 122.8, the classifier 81.0%): sample FD 426.1 (3.47 times), recall
0.339, precision 0.803, sample accuracy 0.793, -ELBO 31,796 nats; the baseline's FD 581.0
(4.73 times), recall 0.047. Seed 1: FD 399.1 (3.25 times), recall 0.291, against the
baseline's 593.9 (4.84 times), 0.055. Seed 2: FD 623.9 (5.08 times), recall 0.110. Medians of
the three: FD 426.1 (3.47 times), recall 0.291 (experiments/LOG.md, 2026-12-01). Taken: the
chooser picks the conv model for colour images of 64x64 or more.
"""

from experiments.pins import NO_BOUNDS

STAGES = [["--dataset", "emoji", "--architecture", "conv", "--epochs", "34"]]
EVAL = NO_BOUNDS
BASELINE = "emoji"
BUDGET_MINUTES = 90
SEEDS = (0, 1, 2)
DEVICE = "cpu"
