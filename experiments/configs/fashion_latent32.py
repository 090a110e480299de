"""Fashion-MNIST's chosen defaults with a 32-dimensional latent instead of 16: a screen of
whether the MLP's reconstructions, as far from the real garments as its samples, are held back
by the bottleneck. A step costs about the baseline's (only the encoder's last layer and the
decoder's first grow), and both train 29 epochs.

    python -m experiments.run fashion_latent32 --seeds 0 --with-baseline
"""

from experiments.pins import NO_BOUNDS

STAGES = [["--dataset", "fashion_mnist", "--epochs", "29", "--latent-dim", "32"]]
EVAL = NO_BOUNDS
BASELINE = "fashion"
BUDGET_MINUTES = 40
SEEDS = (0,)
DEVICE = "cpu"
