"""The pieces of cvae/export/ that need no trained model: the ONNX-friendly mixture prior gives
`cvae.model.prior.sample`'s bits, weights keep their names through safetensors, functions hold
only the weights they read, and a manifest names the file that differs."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from cvae.config import presets
from cvae.errors import CheckpointError
from cvae.export.functions import onnx_prior_sample, used_variables
from cvae.export.manifest import is_export, verify_folder, write_manifest
from cvae.export.weights import flatten, load_weights, save_weights, unflatten
from cvae.model import prior as prior_lib


def mixture(classes=10, components=3, latent=4, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    weights = rng.random((classes, components)).astype(np.float32)
    tril = np.tril(rng.normal(size=(classes, components, latent, latent))).astype(np.float32)
    return {"weights": weights / weights.sum(-1, keepdims=True),
            "means": rng.normal(size=(classes, components, latent)).astype(np.float32),
            "scale_tril": tril}


@pytest.mark.parametrize("radius", [None, 1.5], ids=["plain", "truncated"])
def test_the_onnx_prior_gives_the_priors_bits(radius):
    prior = mixture()
    rng = np.random.default_rng(1)
    noise = rng.normal(size=(20000, 4)).astype(np.float32) * np.float32(1.7)
    noise[:100, 0] = np.arange(-50, 50) / np.float32(1000)  # exact multiples: frac is 0 or -0
    labels = rng.integers(0, 10, 20000).astype(np.int32)
    ours = jax.jit(onnx_prior_sample, static_argnames="radius")(prior, noise, labels,
                                                                radius=radius)
    theirs = jax.jit(prior_lib.sample, static_argnames="radius")(prior, noise, labels,
                                                                 radius=radius)
    assert np.array_equal(np.asarray(ours).view(np.uint32), np.asarray(theirs).view(np.uint32))


def test_weights_keep_their_names_and_bits_through_safetensors(tmp_path):
    variables = {"params": {"decoder": {"Dense_0": {"kernel": np.ones((2, 3), np.float32),
                                                    "bias": np.zeros(3, np.float32)}}},
                 "prior": {"mixture": mixture(components=2)}}
    save_weights(tmp_path / "model.safetensors", variables, {"step": "3"})
    loaded = load_weights(tmp_path / "model.safetensors")
    assert set(flatten(loaded)) == {"params.decoder.Dense_0.kernel", "params.decoder.Dense_0.bias",
                                    "prior.mixture.weights", "prior.mixture.means",
                                    "prior.mixture.scale_tril"}
    assert jax.tree.all(jax.tree.map(np.array_equal, loaded, variables))
    assert unflatten(flatten(variables)).keys() == variables.keys()


def test_each_function_holds_only_the_weights_it_reads():
    """What each function keeps is the family's `EXPORT_MODULES` (cvae/model/interface.py)."""
    config = presets.test()
    variables = {"params": {"encoder": 1, "decoder": 2, "classifier": 3},
                 "batch_stats": {"encoder": 4, "decoder": 5}, "prior": {"mixture": 6}}
    assert used_variables(variables, "sample", config) == {
        "params": {"decoder": 2}, "batch_stats": {"decoder": 5}, "prior": {"mixture": 6}}
    assert used_variables(variables, "encode", config) == {
        "params": {"encoder": 1, "decoder": 2}, "batch_stats": {"encoder": 4, "decoder": 5}}
    assert used_variables(variables, "classify", config) == {"params": {"classifier": 3}}
    ladder_config = config.replace(model="ladder", stochastic_layers=2)
    ladder = {"params": {"bottom": 1, "upper_0": 2, "bottom_up_heads_1": 3, "top_down_nets_0": 4,
                         "top_down_heads_0": 5, "decoder_layers_1": 6, "decoder_blocks_0": 9,
                         "pixels": 7, "classifier": 10},
              "prior": {"mixture": 8}}  # its modules (cvae/model/ladder.py)
    assert used_variables(ladder, "sample", ladder_config) == {"params": {
        "top_down_nets_0": 4, "top_down_heads_0": 5, "decoder_layers_1": 6,
        "decoder_blocks_0": 9, "pixels": 7}, "prior": {"mixture": 8}}
    assert used_variables(ladder, "encode", ladder_config) == {"params": {
        k: v for k, v in ladder["params"].items() if k != "classifier"}}
    assert used_variables(ladder, "classify", ladder_config) == {"params": {"classifier": 10}}


def test_a_manifest_names_the_file_that_differs(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"one")
    (tmp_path / "b.bin").write_bytes(b"two")
    manifest = write_manifest(tmp_path, {"step": 5})
    assert is_export(tmp_path) and manifest["step"] == 5
    assert set(json.loads((tmp_path / "manifest.json").read_text())["files"]) == {"a.bin",
                                                                                  "b.bin"}
    assert verify_folder(tmp_path)["files"]["a.bin"]["bytes"] == 3
    (tmp_path / "b.bin").write_bytes(b"TWO")
    with pytest.raises(CheckpointError, match=r"b\.bin: its sha256 does not match"):
        verify_folder(tmp_path)
    assert verify_folder(tmp_path, names=("a.bin",))  # only the files asked for
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(CheckpointError, match="not a cvae export manifest"):
        verify_folder(tmp_path)
