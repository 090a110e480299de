"""The DReG bound (K = 5) as the training objective from the start, in the default's 5
minutes: a negative result. A DReG step costs about 5.6 ELBO steps, so the run reaches the
bound of an ELBO model trained for 2 minutes.

    python -m experiments.run dreg_k5 --with-baseline

Measured 2026-11-25 on 2 CPU cores, three seeds, medians, samples drawn 500 a digit; ranking
bounds: -log p(x|y) 84.52, sample accuracy 99.20%, FD 4.66, recall 0.748, 12,140 steps, every
run stopped at 5 minutes. Its baseline (`default_120`): 82.55, 99.24%, 3.80, 0.774.
"""

from experiments.pins import DEFAULT_50K, RANKING

STAGES = [DEFAULT_50K + ["--epochs", "50", "--objective", "dreg", "--importance-samples", "5"]]
EVAL = RANKING + ["--balanced-samples"]
BASELINE = "default_120"
BUDGET_MINUTES = 5
SEEDS = (0, 1, 2)
DEVICE = "cpu"
