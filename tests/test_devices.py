"""Data parallelism on 4 host CPU devices (a subprocess: the device count is fixed at start-up)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from cvae.training.devices import all_reduce_bytes

SCRIPT = r"""
import json, sys
import jax, numpy as np
sys.path.insert(0, sys.argv[1])
from cvae import presets
from cvae.training.callbacks import Callback, Checkpointer
from cvae.training.checkpoints import load_checkpoint
from cvae.training.loop import train_and_evaluate
from cvae.data.synthetic import synthetic_dataset

class Losses(Callback):
    def __init__(self): self.values = []
    def on_step_end(self, run, metrics): self.values += [float(v) for v in metrics["loss"]]

config = presets.test().replace(epochs=2, batch_size=16, **json.loads(sys.argv[3]))
data = synthetic_dataset(80)
out = {"devices": len(jax.devices())}
for name, devices in (("one", jax.devices()[:1]), ("four", jax.devices())):
    losses = Losses()
    run = train_and_evaluate(config, data, sys.argv[2] + "/" + name,
                             callbacks=[losses, Checkpointer()],
                             devices=devices)
    out[name] = losses.values
    out[name + "_sharding"] = str(jax.tree.leaves(run.state.params)[0].sharding)
# A checkpoint written on four devices restores on one.
restored = load_checkpoint(sys.argv[2] + "/four")
out["restored_step"] = restored.step
out["restored_devices"] = len(jax.tree.leaves(restored.state.params)[0].devices())
# What one data-parallel step all-reduces, read from the compiled 4-device program.
from cvae.model.registry import create_model
from cvae.training.optimizer import create_optimizer
from cvae.training.devices import all_reduce_bytes, create_mesh, replicate
from cvae.training.step import create_train_chunk, create_train_step, epoch_permutation, run_key
from cvae.training.supervision import FullLabels
mesh = create_mesh()
key = run_key(0)
state, step = create_train_step(create_model(config), create_optimizer(config, 8)[0], config,
                                key=key, supervision=FullLabels(config), mesh=mesh)
images, labels, order = replicate((np.zeros((64, 784), np.uint8), np.zeros(64, np.int32),
                                   epoch_permutation(key, 0, 64)), mesh)
chunk = create_train_chunk(step, config.batch_size, mesh)
hlo = chunk.lower(state, images, labels, order, 0, key, num_steps=1).compile().as_text()
out["all_reduce"] = all_reduce_bytes(hlo)
out["parameters"] = sum(x.size for x in jax.tree.leaves(state.params))
print(json.dumps(out))
"""


def run_script(tmp_path, changes: dict) -> dict:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(Path(__file__).parent),
                             str(tmp_path), json.dumps(changes)], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_model_lever_trains_the_same_on_four_devices_as_on_one(tmp_path):
    """The model levers at once, one device against four: a two-layer ladder trained with DReG
    (K = 3) under a VampPrior."""
    out = run_script(tmp_path, {"objective": "dreg", "importance_samples": 3, "prior": "vamp",
                                "pseudo_inputs": 2, "model": "ladder", "stochastic_layers": 2,
                                "upper_latent_dim": 2})
    assert len(out["one"]) == len(out["four"]) == 8
    for single, parallel in zip(out["one"], out["four"]):
        assert abs(single - parallel) <= 1e-3 * abs(single), (out["one"], out["four"])
    assert out["restored_step"] == 8


def test_four_device_training_matches_one_device(tmp_path):
    out = run_script(tmp_path, {})
    assert out["devices"] == 4
    assert len(out["one"]) == len(out["four"]) == 8
    for single, parallel in zip(out["one"], out["four"]):
        assert abs(single - parallel) <= 1e-3 * abs(single), (out["one"], out["four"])
    assert "'data': 4" in out["four_sharding"] and "spec=P()" in out["four_sharding"]
    assert out["restored_step"] == 8 and out["restored_devices"] == 1
    # And in a process that has a single device.
    single = subprocess.run(
        [sys.executable, "-c", "import sys; from cvae.training.checkpoints import load_checkpoint; "
         "print(load_checkpoint(sys.argv[1]).step)", str(tmp_path / "four")],
        env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True, timeout=120)
    assert single.returncode == 0, single.stderr[-2000:]
    assert single.stdout.strip() == "8"
    # Gradients of every float32 parameter, plus a few scalar loss terms.
    all_reduced, ops = out["all_reduce"]
    assert ops >= 1 and 0 <= all_reduced - 4 * out["parameters"] <= 4 * 8


def test_all_reduce_bytes_sum_the_result_shapes_of_each_all_reduce():
    hlo = """
  %p = f32[8]{0} parameter(0)
  %all-reduce.3 = (f32[784,512]{1,0}, f32[512]{0}, f32[]) all-reduce(%a, %b, %c), to_apply=%add
  %all-reduce-start = bf16[4,2]{1,0} all-reduce-start(bf16[4,2]{1,0} %d), to_apply=%add
  %gte = f32[512]{0} get-tuple-element(%all-reduce.3), index=1
"""
    assert all_reduce_bytes(hlo) == (4 * (784 * 512 + 512 + 1) + 2 * 8, 2)
