"""A screen: the emoji (64x64 colour) with the chosen defaults and the convolutional encoder
and decoder (`--architecture conv`), its epochs chosen for the same 30 minutes as the MLP's.

    python -m experiments.run emoji_conv --seeds 0

The emoji prepared first, as docs/own-images.md does: `npm pack emoji-datasource-google@16.0.0`,
`python scripts/example_datasets.py emoji emoji`, then `cvae data --from emoji --name emoji`.

On 64x64 colour the MLP's output layer holds about 100 million weights, and its step timed at
3.1 s against the conv model's 2.5 s (2-core Intel Xeon, the same minute): whether the conv
model, more epochs in the same time and spatial structure, draws emoji nearer the real ones
than the MLP (the Results table's seed 0: FD 11 times the real halves', recall 0.02).
"""

from experiments.pins import NO_BOUNDS

STAGES = [["--dataset", "emoji", "--architecture", "conv", "--epochs", "34"]]
EVAL = NO_BOUNDS
BASELINE = "emoji"
BUDGET_MINUTES = 90
SEEDS = (0,)
DEVICE = "cpu"
