"""Which of issue 26's model levers `cvae train` runs yet, and with what.

Trained: `--objective iwae | dreg` (K importance samples) and `--prior vamp | learned_mixture`
for the one-latent CVAE, through `cvae.model.lever_losses` in the same `create_train_step`.
Not yet: the ladder (`--stochastic-layers 2+`; its modules and losses exist, the sampler's
blocks for its noise do not), and the levers with `--labels N`, BatchNorm or dropout (the
lever losses apply the model in inference mode, and M2's loss has its own terms). `cvae train`
refuses these by name rather than train something else under their name. No JAX here: the CLI
checks before JAX loads.
"""

from __future__ import annotations

from cvae.config import Config
from cvae.errors import ConfigError

NOT_YET_TRAINED = {"stochastic_layers": "1 runs"}


def _uses_levers(config: Config) -> bool:
    return config.objective != "elbo" or config.prior in ("vamp", "learned_mixture")


def check_trainable(config: Config) -> None:
    """Raise ConfigError naming the first lever the training code does not run yet."""
    if config.stochastic_layers > 1:
        raise ConfigError(f"stochastic_layers={config.stochastic_layers}: not trained yet "
                          f"(issue 26 builds it in two steps; 1 runs)")
    if not _uses_levers(config):
        return
    lever = (f"objective={config.objective!r}" if config.objective != "elbo"
             else f"prior={config.prior!r}")
    for name, value, why in (("labels", config.labelled_count is not None, "--labels N"),
                             ("batch_norm", config.batch_norm, "--batch-norm"),
                             ("dropout_rate", config.dropout_rate > 0, "--dropout-rate")):
        if value:
            raise ConfigError(f"{lever}: not trained with {why} yet (issue 26; without it, "
                              f"it runs)")
