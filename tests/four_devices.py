"""One process with 4 host CPU devices that trains each data-parallel case on one device and on
all four: the test config (`default`), the model levers at once (`lever`: a two-layer ladder
trained with DReG, K = 3, under a VampPrior) and semi-supervised training with its classifier's
levers (`semi`). The device count is fixed when JAX starts, so these share one subprocess (its
imports and start-up paid once) and write `results.json`, which the `four_device_runs` fixture
(tests/conftest.py) reads for tests/test_devices.py and tests/test_few_labels.py.

    python tests/four_devices.py DIRECTORY
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from host_devices import with_host_devices

LEVERS = {"objective": "dreg", "importance_samples": 3, "prior": "vamp", "pseudo_inputs": 2,
          "model": "ladder", "stochastic_layers": 2, "upper_latent_dim": 2}
SEMI = {"labels": "20", "labelled_per_batch": 4, "validation_size": 32, "epochs": 1,
        "prior": "mixture", "prior_components": 10, "prior_codes": "means", "vat_weight": 1.0,
        "entropy_weight": 0.5}


def run(directory: Path) -> None:
    """This file as a 4-device subprocess writing into `directory`."""
    env = with_host_devices({**os.environ, "JAX_PLATFORMS": "cpu"}, 4)
    result = subprocess.run([sys.executable, __file__, str(directory)], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def results(directory: Path) -> dict:
    return json.loads((directory / "results.json").read_text())


def main(directory: Path) -> None:
    import jax

    from cvae.config import presets
    from cvae.data.synthetic import synthetic_dataset
    from cvae.training.callbacks import Callback, Checkpointer
    from cvae.training.checkpoints import load_checkpoint
    from cvae.training.loop import train_and_evaluate

    class Metrics(Callback):
        def __init__(self, names):
            self.values = {name: [] for name in names}

        def on_step_end(self, run, metrics):
            for name, values in self.values.items():
                values += [float(v) for v in metrics[name]]

    def one_and_four(name, config, data, *, names=("loss",), save=True) -> dict:
        out = {"devices": len(jax.devices())}
        for count, devices in (("one", jax.devices()[:1]), ("four", jax.devices())):
            metrics = Metrics(names)
            run = train_and_evaluate(config, data, directory / name / count,
                                     callbacks=[metrics, *([Checkpointer()] if save else [])],
                                     devices=devices)
            out[count] = metrics.values
            out[count + "_sharding"] = str(jax.tree.leaves(run.state.params)[0].sharding)
        if save:  # a checkpoint written on four devices restores on one
            restored = load_checkpoint(directory / name / "four")
            out["restored_step"] = restored.step
            out["restored_devices"] = len(jax.tree.leaves(restored.state.params)[0].devices())
        return out

    small = presets.test().replace(epochs=2, batch_size=16)
    out = {"default": one_and_four("default", small, synthetic_dataset(80)),
           "lever": one_and_four("lever", small.replace(**LEVERS), synthetic_dataset(80)),
           "semi": one_and_four("semi", presets.test().replace(**SEMI), synthetic_dataset(200),
                                names=("loss", "virtual_adversarial"), save=False)}
    out["default"].update(all_reduce(small))
    (directory / "results.json").write_text(json.dumps(out))


def all_reduce(config) -> dict:
    """What one data-parallel step all-reduces, read from the compiled 4-device program."""
    import jax
    import numpy as np

    from cvae.model.registry import create_model
    from cvae.training.devices import all_reduce_bytes, create_mesh, replicate
    from cvae.training.optimizer import create_optimizer
    from cvae.training.step import (create_train_chunk, create_train_step, epoch_permutation,
                                    run_key)
    from cvae.training.supervision import FullLabels

    mesh = create_mesh()
    key = run_key(0)
    state, step = create_train_step(create_model(config), create_optimizer(config, 8)[0], config,
                                    key=key, supervision=FullLabels(config), mesh=mesh)
    images, labels, order = replicate((np.zeros((64, 784), np.uint8), np.zeros(64, np.int32),
                                       epoch_permutation(key, 0, 64)), mesh)
    chunk = create_train_chunk(step, config.run.batch_size, mesh, max_steps=1)
    hlo = chunk.jitted.lower(state, images, labels, order, 0, key, num_steps=1).compile().as_text()
    return {"all_reduce": all_reduce_bytes(hlo),
            "parameters": sum(x.size for x in jax.tree.leaves(state.params))}


if __name__ == "__main__":
    main(Path(sys.argv[1]))
