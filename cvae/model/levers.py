"""Which model levers `cvae train` runs, and with what.

Trained, through `cvae.model.lever_losses` in the same `create_train_step`: `--objective iwae |
dreg` (K importance samples), `--prior vamp | learned_mixture`, and the ladder VAE
(`--stochastic-layers 2+`, an MLP; its sample noise is every layer, its codes the top layer's,
cvae/model/widths.py), which the sampler, the service, `cvae export` and `cvae eval` serve like
the one-latent CVAE. Not yet: the levers with `--labels N`, BatchNorm or dropout (the lever
losses apply the model in inference mode, and M2's loss has its own terms), and a ladder with
convolutions or a frozen part (its networks are MLPs of their own names). `cvae train` refuses
these by name rather than train something else under their name. No JAX here: the CLI checks
before JAX loads.
"""

from __future__ import annotations

from cvae.config import Config
from cvae.errors import ConfigError


def _uses_levers(config: Config) -> bool:
    return (config.objective != "elbo" or config.prior in ("vamp", "learned_mixture")
            or config.stochastic_layers > 1)


def _lever(config: Config) -> str:
    if config.stochastic_layers > 1:
        return f"stochastic_layers={config.stochastic_layers}"
    return (f"objective={config.objective!r}" if config.objective != "elbo"
            else f"prior={config.prior!r}")


def check_trainable(config: Config) -> None:
    """Raise ConfigError naming the first lever the training code does not run yet."""
    if not _uses_levers(config):
        return
    lever = _lever(config)
    ladder = config.stochastic_layers > 1
    for value, why in ((config.labelled_count is not None, "--labels N"),
                       (config.batch_norm, "--batch-norm"),
                       (config.dropout_rate > 0, "--dropout-rate"),
                       (ladder and config.architecture != "mlp", "--architecture conv"),
                       (ladder and config.freeze != "none", "--freeze")):
        if value:
            raise ConfigError(f"{lever}: not trained with {why} yet (without it, it runs)")
