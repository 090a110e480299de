"""The emoji (64x64 colour) with the chosen defaults of 2026-11-30 (`cvae train --dataset
emoji`: the MLP, the 5-component logistic mixture, sharpness 10; `--architecture mlp` since the
chooser picks the conv model for them), its epochs fixed at what the step timed on the
2-core Intel Xeon chose for 30 minutes on a quiet machine (26, a step at 3.1 s), so that a lever
trains in the same compute whatever else runs: the baseline of the emoji screens.

    python -m experiments.run emoji --seeds 0,1,2

The emoji prepared first, as docs/own-images.md does: `npm pack emoji-datasource-google@16.0.0`,
`python scripts/example_datasets.py emoji emoji`, then `cvae data --from emoji --name emoji`.

Measured 2026-12-01 on the 2-core Intel Xeon (AVX-512, AMX), seed 0 (a CI run beside it, so
3,047 s): in recipe v2's features (real halves 122.8, the classifier 81.0%): sample FD 581.0
(4.73 times), recall 0.047, precision 0.906, sample accuracy 0.848, -ELBO 32,999 nats. Seed 1
(alone, 1,342 s): FD 593.9 (4.84 times), recall 0.055, sample accuracy 0.858, -ELBO 32,925.
Seed 2 (alone, 1,415 s): FD 620.0 (5.05 times), recall 0.050, sample accuracy 0.856, -ELBO
33,185. Medians of the three: FD 593.9 (4.84 times), recall 0.050.
"""

from experiments.pins import NO_BOUNDS

STAGES = [["--dataset", "emoji", "--architecture", "mlp", "--epochs", "26"]]
EVAL = NO_BOUNDS
BASELINE = None
BUDGET_MINUTES = 90
SEEDS = (0, 1, 2)
DEVICE = "cpu"
