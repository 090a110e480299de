"""An exported folder -> the sampler that `cvae sample` and `cvae serve` use, with no Orbax
and no optimizer: the config from `config.json`, the variables from `model.safetensors`, the
model rebuilt from the config. The sampler's programs are the checkpoint's own, so a folder
gives the same pixels, PNG bytes and ETags as the checkpoint it was exported from.

Synopsis:

    sampler = open_sampler("checkpoints")          # a checkpoint directory, or
    sampler = open_sampler("exported/mnist-cvae")  # an exported folder (cvae export)
    png = sampler.sample_png(digit=7, n=16, seed=0)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from cvae.config.sections import Config
from cvae.errors import CheckpointError, StepNotFound
from cvae.export.config_file import CONFIG, read_config
from cvae.export.manifest import is_export, verify_folder
from cvae.export.weights import WEIGHTS, load_weights

@dataclasses.dataclass(frozen=True)
class ExportedModel:
    step: int
    config: Config
    variables: dict  # as `TrainState.eval_variables()`, NumPy arrays
    manifest: dict


def load_export(folder: str | Path) -> ExportedModel:
    """Read an exported folder after checking its weights and config against the manifest
    (CheckpointError naming the file that differs)."""
    folder = Path(folder)
    manifest = verify_folder(folder, names=(WEIGHTS, CONFIG))
    missing = [name for name in (WEIGHTS, CONFIG) if name not in manifest["files"]]
    if missing:
        raise CheckpointError(f"{folder}: its manifest lists no {', '.join(missing)}")
    config = read_config((folder / CONFIG).read_text(), str(folder / CONFIG))
    return ExportedModel(int(manifest["step"]), config, load_weights(folder / WEIGHTS), manifest)


def load_exported_sampler(folder: str | Path, block_rows: int | None = None, *,
                          truncation: float | None = None, check: str = "all"):
    """`cvae.sampling.sampler.load_sampler` for an exported folder: blocks verified here."""
    from cvae.model.registry import create_model
    from cvae.sampling.sampler import create_sampler

    exported = load_export(folder)
    config = exported.config.drawn_at(truncation)
    sampler = create_sampler(create_model(config), config, exported.variables,
                             step=exported.step, block_rows=block_rows)
    sampler.check_blocks(check)
    return sampler


def exported_step(folder: str | Path) -> int:
    from cvae.export.manifest import read_manifest

    return int(read_manifest(folder)["step"])


def open_sampler(path: str | Path, step=None, block_rows: int | None = None, *,
                 truncation: float | None = None, check: str = "all"):
    """A sampler for a checkpoint directory (its newest step, or the one `step` chooses:
    `cvae.model.store.StepChoice`) or an exported folder (its one step, which is also its
    latest and best; another step number is StepNotFound), drawing at `truncation` (None: the
    run's own; `Config.drawn_at`), its block sizes checked as `check` says
    (`Sampler.check_blocks`)."""
    if not is_export(path):
        from cvae.sampling.sampler import load_sampler

        return load_sampler(path, step, block_rows, truncation=truncation, check=check)
    if isinstance(step, int) and step != exported_step(path):
        raise StepNotFound(path, step, [exported_step(path)])
    return load_exported_sampler(path, block_rows, truncation=truncation, check=check)
