"""The seeded colour digits (32x32 colour) with the chosen defaults of 2026-12-01 (`cvae train
--dataset colour`: the MLP, the 5-component logistic mixture, sharpness 10, a tenth for
validation, 140 epochs, the most it chooses), the epochs fixed so that a lever trains the same
steps whatever the machine: the baseline of the colour-digit screens.

    python -m experiments.run colour --seeds 0,1,2

The colour digits prepared first, as docs/own-images.md does: `python
scripts/example_datasets.py colour colour.npz`, then `cvae data --from colour.npz --name colour`.

Its three seeds are the same commands as the Results table's (`make results TABLE=colour`, run
2026-12-01 on the 2-core AMD EPYC (AVX-512) alone, a step timed at 320 to 343 ms, 8 minutes of
training a seed), so those runs are its measurement: in recipe v2's features (real halves
290.7, the classifier 83.6%), sample FD 970.1 / 924.5 / 883.6 (median 924.5, 3.18 times),
recall 0.000 / 0.011 / 0.006, sample accuracy 0.520 / 0.581 / 0.536, -ELBO 10,509 / 10,427 /
10,384 nats (docs/results/colour-seed*.json). Against it, `--architecture conv` at the same
compute learnt the backgrounds only (sample accuracy 0.12 and 0.09, two seeds;
experiments/LOG.md, 2026-12-01 midday).
"""

from experiments.pins import NO_BOUNDS

STAGES = [["--dataset", "colour", "--epochs", "140"]]
EVAL = NO_BOUNDS
BASELINE = None
BUDGET_MINUTES = 40
SEEDS = (0, 1, 2)
DEVICE = "cpu"
