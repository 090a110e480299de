"""The default model (`make train`): the baseline of every 5-minute experiment.

    python -m experiments.run default

Measured 2026-11-26 on 2 CPU cores (AMD EPYC, AVX-512), three seeds, medians; ranking bounds
(IWAE K = 500 on the first 2,000 test digits): -log p(x|y) 81.85, -log p(x) 84.05, sample
accuracy 99.32%, FD 2.29, precision 0.886, recall 0.828, Bayes' rule's error 1.90%; about
250 s a run. By the published protocol (`cvae eval --iwae-k 5000 --iwae-k-marginal 10`):
-log p(x|y) 81.71, -log p(x) 83.96.
"""

from experiments.pins import RANKING

STAGES = [[]]
EVAL = RANKING
BASELINE = None
BUDGET_MINUTES = 5
SEEDS = (0, 1, 2)
DEVICE = "cpu"
