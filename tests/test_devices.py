"""Data parallelism on 4 host CPU devices (one subprocess for the session, the device count being
fixed at start-up: tests/four_devices.py)."""

import jax
import pytest

from cvae.training.checkpoints import load_checkpoint
from cvae.training.devices import all_reduce_bytes


def assert_same_losses(out: dict) -> None:
    assert len(out["one"]["loss"]) == len(out["four"]["loss"]) == 8
    for single, parallel in zip(out["one"]["loss"], out["four"]["loss"]):
        assert abs(single - parallel) <= 1e-3 * abs(single), (out["one"], out["four"])


@pytest.mark.slow  # a 4-device subprocess: `make test-slow`
def test_a_model_lever_trains_the_same_on_four_devices_as_on_one(four_device_runs):
    """The model levers at once, one device against four: a two-layer ladder trained with DReG
    (K = 3) under a VampPrior."""
    out = four_device_runs["lever"]
    assert_same_losses(out)
    assert out["restored_step"] == 8


@pytest.mark.slow  # a 4-device subprocess: `make test-slow`
def test_four_device_training_matches_one_device(four_device_runs):
    out = four_device_runs["default"]
    assert out["devices"] == 4
    assert_same_losses(out)
    assert "'data': 4" in out["four_sharding"] and "spec=P()" in out["four_sharding"]
    assert out["restored_step"] == 8 and out["restored_devices"] == 1
    # And in a process that has a single device: this one.
    assert jax.device_count() == 1
    restored = load_checkpoint(four_device_runs["directory"] / "default" / "four")
    assert restored.step == 8
    assert len(jax.tree.leaves(restored.state.params)[0].devices()) == 1
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
