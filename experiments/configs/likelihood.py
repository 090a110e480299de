"""The likelihood preset (`make likelihood`): 640 epochs of the ELBO on 59,000 digits, then 20
epochs of the DReG bound (K = 5) from those weights, in 30 minutes of 2 CPU cores.

    python -m experiments.run likelihood --with-baseline

Measured 2026-11-26 on 2 CPU cores, each run alone, three seeds, medians; by the published
protocol (IWAE K = 5000 on all 10,000 test digits): -log p(x|y) 79.94, -log p(x) 82.19,
Bayes' rule's error 1.30%; by the ranking bounds 79.92 against its compute-matched baseline
`likelihood_850`'s 80.69. About 1,626 s a run. Samples (`cvae eval --pixel-sharpness 1.2`):
FD 2.64, recall 0.855, sample accuracy 99.04%.
"""

from experiments.pins import PUBLISHED

STAGES = [["--preset", "likelihood"], ["--preset", "likelihood-dreg"]]
EVAL = PUBLISHED
BASELINE = "likelihood_850"
BUDGET_MINUTES = 30
SEEDS = (0, 1, 2)
DEVICE = "cpu"
