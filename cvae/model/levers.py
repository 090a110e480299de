"""Which of issue 26's model levers `cvae train` runs yet.

Their modules exist (cvae/model/objectives.py, hierarchical.py, learned_prior.py) and their
config knobs validate and round-trip, but the train step, the sampler and `cvae eval` do not run
them until the second step of the issue wires them in: `cvae train` refuses them by name rather
than train today's model under their name. No JAX here: the CLI checks before JAX loads.
"""

from __future__ import annotations

from cvae.config import Config
from cvae.errors import ConfigError

NOT_YET_TRAINED = {"objective": ("iwae", "dreg"), "prior": ("vamp", "learned_mixture")}


def check_trainable(config: Config) -> None:
    """Raise ConfigError naming the first lever the training code does not run yet."""
    for name, values in NOT_YET_TRAINED.items():
        if getattr(config, name) in values:
            raise ConfigError(f"{name}={getattr(config, name)!r}: not trained yet (issue 26 "
                              f"builds it in two steps; today's choices run)")
    if config.stochastic_layers > 1:
        raise ConfigError(f"stochastic_layers={config.stochastic_layers}: not trained yet "
                          f"(issue 26 builds it in two steps; 1 runs)")
