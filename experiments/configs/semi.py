"""`--preset semi` (`make semi`): 100 labels, M2 with virtual adversarial training and entropy
minimisation, 15 epochs.

    python -m experiments.run semi --with-baseline

Measured 2026-11-25 on 2 CPU cores, each run alone; the seed picks the labelled set. Test
error of q(y|x): 2.48%, 2.44%, 5.87% (3.60% +- 1.97), about 221 s a run. Its compute-matched
baseline `semi_m2` (M2 for 17 epochs, the same time): 6.63% +- 1.21.
"""

from experiments.pins import NO_BOUNDS

STAGES = [["--preset", "semi"]]
EVAL = NO_BOUNDS
BASELINE = "semi_m2"
BUDGET_MINUTES = 30
SEEDS = (0, 1, 2)
DEVICE = "cpu"
