"""`--preset conv`: the default with the convolutional encoder and decoder for 100 epochs, on
a GPU. The best bounds, sample accuracy and FD measured; too slow for 2 CPU cores.

    python -m experiments.run conv      # on a GPU (`make gpu` first)

Measured 2026-11-27 on one NVIDIA H200, three seeds, medians; ranking bounds: -log p(x|y)
80.17, -log p(x) 82.44, sample accuracy 99.60%, FD 2.12, precision 0.889, recall 0.835,
reconstructions' FD 4.70; 99 s a run. Seed 0 on 2 CPU cores took 73 minutes (a machine at
about half its usual speed) and scored 79.87 nats, 99.38%, FD 2.06.
"""

from experiments.pins import RANKING

STAGES = [["--preset", "conv"]]
EVAL = RANKING
BASELINE = "default"
BUDGET_MINUTES = 10
SEEDS = (0, 1, 2)
DEVICE = "gpu"
