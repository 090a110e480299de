"""The likelihood preset's model trained with the ELBO alone for its 30 minutes: 850 epochs on
50,000 digits (10,000 held out). The compute-matched baseline of `likelihood`.

    python -m experiments.run likelihood_850

Measured 2026-11-25 on 2 CPU cores, three seeds, medians; ranking bounds (K = 500 on the first
2,000 test digits): -log p(x|y) 80.69, -log p(x) 82.87, FD 2.98 (plain means), about 1,625 s
a run. By the published protocol, seed 1 (the median): 80.58 and 82.80.
"""

from experiments.pins import PLAIN, PUBLISHED, SPLIT_50K

STAGES = [["--preset", "likelihood", *SPLIT_50K[:2], *PLAIN, "--epochs", "850"]]
EVAL = PUBLISHED
BASELINE = None
BUDGET_MINUTES = 30
SEEDS = (0, 1, 2)
DEVICE = "cpu"
