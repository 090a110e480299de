"""The default as a two-layer ladder VAE (8 latents above its 16): a negative result. A step
costs about 1.14 of the default's, so the two train in about the same time.

    python -m experiments.run ladder2 --seeds 0 --with-baseline

Measured 2026-11-27 on 2 CPU cores running at about half their usual speed (525 s, so the
budget here is 10 minutes), one seed; ranking bounds: -log p(x|y) 83.59, sample accuracy
99.48%, FD 2.37, precision 0.906, recall 0.795. The default's seed 0: 81.86, 99.36%, 2.29,
0.884, 0.837.
"""

from experiments.pins import RANKING

STAGES = [["--model", "ladder", "--stochastic-layers", "2", "--upper-latent-dim", "8"]]
EVAL = RANKING
BASELINE = "default"
BUDGET_MINUTES = 10
SEEDS = (0,)
DEVICE = "cpu"
