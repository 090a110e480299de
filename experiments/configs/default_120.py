"""The default model of 2026-11-25 (50,000 digits, plain means, mixture of means) trained for
120 epochs: as long as fits the 5 minutes. The compute-matched baseline of `dreg_k5`.

    python -m experiments.run default_120

Measured 2026-11-25 on 2 CPU cores, three seeds, medians, samples drawn 500 a digit; ranking
bounds: -log p(x|y) 82.55, sample accuracy 99.24%, FD 3.80, recall 0.774, reconstructions'
FD 2.86. Two of the three seeds were stopped at 5 minutes (a loaded machine).
"""

from experiments.pins import DEFAULT_50K, RANKING

STAGES = [DEFAULT_50K + ["--epochs", "120"]]
EVAL = RANKING + ["--balanced-samples"]
BASELINE = None
BUDGET_MINUTES = 5
SEEDS = (0, 1, 2)
DEVICE = "cpu"
