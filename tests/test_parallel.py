"""Data parallelism on 4 host CPU devices (a subprocess: the device count is fixed at start-up)."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import json, sys
import jax, numpy as np
sys.path.insert(0, sys.argv[1])
from cvae import config as config_lib
from cvae.callbacks import Callback, Checkpointer
from cvae.checkpoint import load_checkpoint
from cvae.loop import train_and_evaluate
from cvae.synthetic import synthetic_dataset

class Losses(Callback):
    def __init__(self): self.values = []
    def on_step_end(self, run, metrics): self.values += [float(v) for v in metrics["loss"]]

config = config_lib.test().replace(epochs=2, batch_size=16)
data = synthetic_dataset(64)
out = {"devices": len(jax.devices())}
for name, devices in (("one", jax.devices()[:1]), ("four", jax.devices())):
    losses = Losses()
    run = train_and_evaluate(config, data, sys.argv[2] + "/" + name, [losses, Checkpointer()],
                             devices=devices)
    out[name] = losses.values
    out[name + "_sharding"] = str(run.state.params["decoder"]["Dense_0"]["kernel"].sharding)
# A checkpoint written on four devices restores on one.
restored = load_checkpoint(sys.argv[2] + "/four")
out["restored_step"] = restored.step
out["restored_devices"] = len(restored.state.params["decoder"]["Dense_0"]["kernel"].devices())
print(json.dumps(out))
"""


def test_four_device_training_matches_one_device(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(Path(__file__).parent),
                             str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["devices"] == 4
    assert len(out["one"]) == len(out["four"]) == 8
    for single, parallel in zip(out["one"], out["four"]):
        assert abs(single - parallel) <= 1e-3 * abs(single), (out["one"], out["four"])
    assert "'data': 4" in out["four_sharding"] and "spec=P()" in out["four_sharding"]
    assert out["restored_step"] == 8 and out["restored_devices"] == 1
    # And in a process that has a single device.
    single = subprocess.run(
        [sys.executable, "-c", "import sys; from cvae.checkpoint import load_checkpoint; "
         "print(load_checkpoint(sys.argv[1]).step)", str(tmp_path / "four")],
        env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True, timeout=120)
    assert single.returncode == 0, single.stderr[-2000:]
    assert single.stdout.strip() == "8"
