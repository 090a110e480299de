"""`--preset semi` with 1,000 labels instead of 100.

    python -m experiments.run semi_1000

Measured 2026-11-25 on 2 CPU cores, each run alone, three labelled sets: test error of q(y|x)
2.18%, 2.08%, 1.76% (2.01% +- 0.22), about 212 s a run. No compute-matched M2 run at 1,000
labels: M2 alone, 15 epochs, one labelled set, scored 2.85%.
"""

from experiments.pins import NO_BOUNDS

STAGES = [["--preset", "semi", "--labels", "1000"]]
EVAL = NO_BOUNDS
BASELINE = None
BUDGET_MINUTES = 30
SEEDS = (0, 1, 2)
DEVICE = "cpu"
