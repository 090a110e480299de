"""M2 with shifts and consistency, no virtual adversarial training, 17 epochs: the time of
`semi`'s 15 (its steps cost about 10% less). The compute-matched baseline of `semi`.

    python -m experiments.run semi_m2

Measured 2026-11-25 on 2 CPU cores, each run alone, three labelled sets: test error of q(y|x)
6.88%, 5.31%, 7.70% (6.63% +- 1.21), about 221 s a run.
"""

from experiments.pins import NO_BOUNDS, SEMI_M2

STAGES = [SEMI_M2 + ["--epochs", "17"]]
EVAL = NO_BOUNDS
BASELINE = None
BUDGET_MINUTES = 30
SEEDS = (0, 1, 2)
DEVICE = "cpu"
