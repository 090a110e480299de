"""Reading a trained model for inference: only what the model applies, never the optimizer; and
checkpoints written by the code before the stage subpackages still load, giving the same bits."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from PIL import Image
from trees import tree_equal

from cvae.config import presets
from cvae.data.synthetic import synthetic_dataset
from cvae.cli.main import EXIT_USER_ERROR, main as cvae_main
from cvae.errors import CheckpointError
from cvae.model.registry import create_model
from cvae.model.store import load_trained_model
from cvae.sampling import blocks
from cvae.sampling.sampler import load_sampler
from cvae.training.checkpoints import create_manager, load_checkpoint, save_checkpoint
from cvae.training.step import create_train_state, run_key

BEFORE_STAGES = Path(__file__).parent / "fixtures" / "checkpoints-before-stages"
EXPECTED = json.loads((BEFORE_STAGES / "expected.json").read_text())


def sha256(*arrays: np.ndarray) -> str:
    return hashlib.sha256(b"".join(np.asarray(a).tobytes() for a in arrays)).hexdigest()


def saved_state(directory: Path, config, optimizer: optax.GradientTransformation):
    """A train state of `config` with `optimizer`'s state, moved off its initial values and
    saved as step 3."""
    state = create_train_state(create_model(config), optimizer, config, key=run_key(0))
    params = jax.tree.map(lambda p: p + 0.25, state.params)
    state = state.replace(params=params, opt_state=optimizer.init(params), step=state.step + 3,
                          ema_params=None if state.ema_params is None
                          else jax.tree.map(lambda p: p - 0.5, params))
    manager = create_manager(directory)
    save_checkpoint(manager, state, config, metrics={"validation_loss": 2.0})
    manager.close()
    return state


def test_inference_reads_the_weights_without_the_optimizer_state(tmp_path):
    """A step whose optimizer state no optimizer of its config could hold (SGD with momentum
    under an Adam config): restoring the whole train state fails on it, inference does not."""
    config = presets.test()
    state = saved_state(tmp_path, config, optax.sgd(0.1, momentum=0.9))
    trained = load_trained_model(tmp_path)
    assert (trained.step, trained.config, trained.metrics) == (3, config, {"validation_loss": 2.0})
    assert trained.labelled == {} and list(trained.variables) == ["params"]
    assert tree_equal(jax.device_get(trained.variables), {"params": jax.device_get(state.params)})
    with pytest.raises(CheckpointError, match="no readable checkpoint"):
        load_checkpoint(tmp_path)


def test_inference_reads_the_moving_average_and_init_from_the_weights(tmp_path):
    config = presets.test().replace(ema_decay=0.9)
    state = saved_state(tmp_path, config, optax.adam(1e-3))
    assert tree_equal(jax.device_get(load_trained_model(tmp_path).variables["params"]),
                      jax.device_get(state.ema_params))
    assert tree_equal(jax.device_get(load_trained_model(tmp_path, use_ema=False).variables),
                      {"params": jax.device_get(state.params)})


def test_weights_of_another_shape_than_the_config_makes_are_a_clear_error(
        trained_run, tmp_path, capsys):
    """Inference restores the shapes the step stored (its Orbax metadata, not a trace of the
    config's model), so a config that disagrees with its weights (edited by hand here) is caught
    where the weights are applied: `cvae sample` says so, naming the parameter, and writes
    nothing."""
    run = trained_run.copy_to(tmp_path / "run", steps=(8,))
    stored = run / "8" / "config" / "metadata"
    config = json.loads(stored.read_text())
    widths = config["model"]["options"]["hidden_sizes"]
    config["model"]["options"]["hidden_sizes"] = [width + 1 for width in widths]
    stored.write_text(json.dumps(config))
    out = tmp_path / "grid.png"
    assert cvae_main(["sample", "--checkpoint-dir", str(run), "--out", str(out)]) == \
        EXIT_USER_ERROR
    error = capsys.readouterr().err
    assert "the weights do not have the shapes that its config's model makes" in error
    assert "expected to generate shape" in error and "Traceback" not in error
    assert not out.exists()


def test_missing_and_empty_dirs_say_what_to_run(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint directory .* run `make train`"):
        load_trained_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint in .*empty.*make train"):
        load_trained_model(tmp_path / "empty")


def test_a_few_label_checkpoint_gives_the_classifier_prior_statistics_and_labelled_set(
        tmp_path):
    trained = load_trained_model(shutil.copytree(BEFORE_STAGES / "few-labels", tmp_path / "run"))
    assert list(trained.variables) == ["params", "batch_stats", "prior"]
    assert "classifier" in trained.variables["params"]
    assert {name: values.shape for name, values in trained.labelled.items()} == {
        "indices": (20,), "labels": (20,)}
    assert sorted(np.bincount(np.asarray(trained.labelled["labels"]))) == [2] * 10


@pytest.mark.parametrize("name", ["every-label", "few-labels"])
def test_checkpoints_written_before_the_stages_sample_the_same_bits(name, tmp_path):
    """The old code's PNG pixels, encodings and q(y|x) (expected.json, written by commit
    3012cbe) bit for bit on CPUs whose kernels round as the recording machine's did (the
    sampler's kernel signature says so); elsewhere the PNG within one grey level. (The recorded
    PNG's bytes are zlib's; its pixels are what the checkpoint decides.)"""
    expected = EXPECTED[name]
    sampler = load_sampler(shutil.copytree(BEFORE_STAGES / name, tmp_path / name))
    assert sampler.step == expected["step"]
    recorded = BEFORE_STAGES / expected["sample_png"]
    assert hashlib.sha256(recorded.read_bytes()).hexdigest() == expected["sample_png_sha256"]
    with Image.open(recorded) as old, Image.open(io.BytesIO(sampler.sample_png(None, 4, 3))) as new:
        old_pixels, new_pixels = np.asarray(old, np.int16), np.asarray(new, np.int16)
    # The old code's probes: the Bayes-rule reading of a model trained with every label came
    # later, so its signature leaves that probe out.
    probes = blocks.sampler_probes(sampler) + (
        blocks.classify_probes(sampler) if "classify_sha256" in expected else [])
    signature = blocks.block_signature(probes, sampler.variables, sampler.block_sizes[0])
    if signature is None or hashlib.sha256(signature).hexdigest() != expected[
            "kernel_signature_sha256"]:
        assert np.abs(new_pixels - old_pixels).max() <= 1
        return
    np.testing.assert_array_equal(new_pixels, old_pixels)
    data = synthetic_dataset(96, 16)
    assert sha256(*sampler.encode(data.test_images, data.test_labels)) == expected[
        "encode_sha256"]
    if "classify_sha256" in expected:
        assert sha256(sampler.classify(data.test_images)) == expected["classify_sha256"]
    else:  # read by Bayes' rule: every probability row sums to one
        np.testing.assert_allclose(sampler.classify(data.test_images).sum(axis=1), 1.0,
                                   rtol=1e-5)
