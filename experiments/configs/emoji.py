"""The emoji (64x64 colour) with the chosen defaults (`cvae train --dataset emoji`: the MLP,
the 5-component logistic mixture, sharpness 10), its epochs fixed at what the step timed on the
2-core Intel Xeon chose for 30 minutes on a quiet machine (26, a step at 3.1 s), so that a lever
trains in the same compute whatever else runs: the baseline of the emoji screens.

    python -m experiments.run emoji --seeds 0

The emoji prepared first, as docs/own-images.md does: `npm pack emoji-datasource-google@16.0.0`,
`python scripts/example_datasets.py emoji emoji`, then `cvae data --from emoji --name emoji`.
"""

from experiments.pins import NO_BOUNDS

STAGES = [["--dataset", "emoji", "--epochs", "26"]]
EVAL = NO_BOUNDS
BASELINE = None
BUDGET_MINUTES = 90
SEEDS = (0,)
DEVICE = "cpu"
