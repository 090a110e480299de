"""`cvae export` (cvae/export/run.py) for every model option: the folder's files and manifest,
StableHLO giving the sampler's bits, ONNX Runtime within 1e-5 of it (1,000 noise vectors per
digit, every uint8 pixel within 1), and the refusals with one line and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from cvae.export.load import load_export, open_sampler
from cvae.export.manifest import sha256
from cvae.export.onnx_files import run_onnx
from cvae.export.stablehlo import load_stablehlo
from cvae.sampling.grid import _to_uint8
from cvae.sampling.sampler import load_sampler
from cvae.sampling.latents import request_latents

# A variant's export (the few-label model's, the ladder's) is a journey of its own:
# `make test-slow` (docs/development.md).
FEW_LABELS = pytest.param("few-labels", marks=pytest.mark.slow)
KINDS = ("standard", "mixture", FEW_LABELS, pytest.param("ladder", marks=pytest.mark.slow))


def files_of(kind: str) -> set[str]:
    names = {"model.safetensors", "config.json", "README.md", "samples.png", "manifest.json",
             "sample.stablehlo", "sample.onnx", "encode.stablehlo", "encode.onnx"}
    return names | ({"classify.stablehlo", "classify.onnx"} if kind == "few-labels" else set())


@pytest.mark.parametrize("kind", KINDS)
def test_the_folder_holds_every_file_with_its_sha256(kind, exported, export_runs):
    folder = exported(kind)
    assert {p.name for p in folder.iterdir()} == files_of(kind)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["step"] == max(export_runs(kind).steps)
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == sha256(folder / name), name
        assert entry["bytes"] == (folder / name).stat().st_size
    assert set(manifest["files"]) == files_of(kind) - {"manifest.json"}
    # The noise `sample` takes: a ladder's is every layer (4 + 3), its codes the top layer's.
    assert (manifest["noise_dim"], manifest["code_dim"]) == ((7, 3) if kind == "ladder" else
                                                             (4, 4))
    card = (folder / "README.md").read_text()
    assert ("noise ~ N(0, t^2 I) of\n7 dimensions (every latent layer's, the top layer's "
            "first: wider than the 3 values of a code)" in card) == (kind == "ladder")


@pytest.mark.parametrize("kind", KINDS)
def test_the_weights_are_the_checkpoints_under_stable_names(kind, exported, export_runs):
    from cvae.export.weights import flatten
    from cvae.training.checkpoints import load_checkpoint

    checkpoint = load_checkpoint(export_runs(kind).directory)
    model = load_export(exported(kind))
    expected = flatten(checkpoint.state.eval_variables())
    stored = flatten(model.variables)
    assert stored.keys() == expected.keys()
    assert all(np.array_equal(stored[name], np.asarray(expected[name])) for name in expected)
    assert ("params.decoder.Dense_0.kernel" in stored) == (kind != "ladder")
    assert ("params.top_down_nets_0.Dense_0.kernel" in stored) == (kind == "ladder")
    assert ("prior.mixture.means" in stored) == (kind != "standard")
    assert any(name.startswith("params.classifier.") for name in stored) == (kind == "few-labels")
    assert any(name.startswith("batch_stats.") for name in stored) == (kind == "mixture")
    assert model.config == checkpoint.config


@pytest.mark.determinism
@pytest.mark.parametrize("kind", KINDS)
def test_stablehlo_gives_the_samplers_bits_on_its_block_shapes(kind, exported):
    folder = exported(kind)
    sampler = open_sampler(folder)
    rows = min(sampler.block_sizes)  # 64 here; other CPU kernels may drop to 128 or 256
    per_digit = -(-rows // len(sampler.classes))
    noise, labels = request_latents(3, sampler.classes, per_digit, noise_width=sampler.noise_dim,
                                    temperature=0.8)
    noise, labels = noise[:rows], labels[:rows]
    images = np.asarray(load_stablehlo(folder / "sample.stablehlo").call(noise, labels))
    assert images.view(np.uint32).tobytes() == sampler.decode(noise, labels).view(np.uint32) \
        .tobytes()
    digits = _to_uint8(images)
    x = digits.reshape(rows, -1).astype(np.float32) / np.float32(255)
    exported_encode = load_stablehlo(folder / "encode.stablehlo").call(x, labels)
    for ours, theirs in zip(exported_encode, sampler.encode(digits, labels)):
        assert np.array_equal(np.asarray(ours).view(np.uint32), theirs.view(np.uint32))
    if kind == "few-labels":  # at classify's own smallest block, checked apart from drawing's
        reading = min(sampler.classify_block_sizes)
        digits = _to_uint8(sampler.decode(*request_latents(
            4, sampler.classes, -(-reading // len(sampler.classes)), noise_width=sampler.noise_dim,
            temperature=0.8)))[:reading]
        x = digits.reshape(reading, -1).astype(np.float32) / np.float32(255)
        probabilities = load_stablehlo(folder / "classify.stablehlo").call(x)
        assert np.array_equal(np.asarray(probabilities).view(np.uint32),
                              sampler.classify(digits).view(np.uint32))


def test_stablehlo_takes_any_batch_size_within_float_rounding(exported):
    """Below the sampler's smallest block XLA picks other dot kernels: the same values to
    float32 rounding, not the same bits (docs/export.md)."""
    folder = exported("mixture")
    sampler = open_sampler(folder)
    sample = load_stablehlo(folder / "sample.stablehlo")
    for rows in (1, 3, 100):
        noise, labels = request_latents(0, sampler.classes, rows,
                                        noise_width=sampler.noise_dim, temperature=1.0)
        noise, labels = noise[:rows], labels[:rows]
        images = np.asarray(sample.call(noise, labels))
        assert images.shape == (rows, 28, 28)
        np.testing.assert_allclose(images, sampler.decode(noise, labels), atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_onnx_runtime_agrees_within_1e5_on_1000_noise_vectors_per_digit(kind, exported):
    folder = exported(kind)
    sampler = open_sampler(folder)
    noise, labels = request_latents(7, sampler.classes, 1000, noise_width=sampler.noise_dim,
                                    temperature=1.0)
    ours = run_onnx(folder / "sample.onnx", {"noise": noise, "label": labels})[0]
    theirs = sampler.decode(noise, labels)
    assert ours.shape == theirs.shape == (10000, 28, 28)
    assert np.max(np.abs(ours - theirs)) <= 1e-5
    assert np.max(np.abs(_to_uint8(ours).astype(int) - _to_uint8(theirs).astype(int))) <= 1
    digits = _to_uint8(theirs[:500])
    x = digits.reshape(500, -1).astype(np.float32) / np.float32(255)
    for ours, theirs in zip(run_onnx(folder / "encode.onnx", {"images": x, "label": labels[:500]}),
                            sampler.encode(digits, labels[:500])):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    if kind == "few-labels":
        np.testing.assert_allclose(run_onnx(folder / "classify.onnx", {"images": x})[0],
                                   sampler.classify(digits), atol=1e-5)


@pytest.mark.parametrize("kind", ("mixture", FEW_LABELS))
def test_the_export_reports_what_it_verified(kind, exported):
    verification = json.loads((exported(kind) / "manifest.json").read_text())["verification"]
    classify = {"classify"} if kind == "few-labels" else set()
    assert set(verification["stablehlo_rows"]) == {"sample", "encode"} | classify
    assert verification["onnx"]["rows"] == 10000
    assert verification["onnx"]["sample_max_abs"] <= 1e-5
    assert verification["onnx"]["sample_max_uint8"] <= 1


def test_an_exported_sampler_draws_the_checkpoints_png_bytes(exported, export_runs):
    exported_png = open_sampler(exported("mixture")).sample_png(None, 4, seed=5, scale=2)
    assert exported_png == load_sampler(export_runs("mixture").directory).sample_png(
        None, 4, seed=5, scale=2)


def cvae(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "cvae.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cvae export: error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_export_refuses_a_missing_checkpoint(tmp_path):
    one_line_error(cvae("export", "--checkpoint-dir", tmp_path / "none", "--out",
                        tmp_path / "out"), "no checkpoint directory")
    (tmp_path / "empty").mkdir()
    one_line_error(cvae("export", "--checkpoint-dir", tmp_path / "empty", "--out",
                        tmp_path / "out"), "no checkpoint in")
    assert not (tmp_path / "out").exists()


def test_export_refuses_an_unfinished_checkpoint(tmp_path, trained_run):
    run = trained_run.copy_to(tmp_path / "run")
    (run / "12.orbax-checkpoint-tmp-1234").mkdir()
    one_line_error(cvae("export", "--checkpoint-dir", run, "--out", tmp_path / "out"),
                   "still being written", "12.orbax-checkpoint-tmp")
    (run / "12.orbax-checkpoint-tmp-1234").rmdir()
    (run / "12").mkdir()  # a step folder that does not read
    one_line_error(cvae("export", "--checkpoint-dir", run, "--out", tmp_path / "out"),
                   "newest step, 12, does not read")
    (run / "12" / "_CHECKPOINT_METADATA").write_text("{}")  # committed, but damaged
    one_line_error(cvae("export", "--checkpoint-dir", run, "--out", tmp_path / "out"),
                   "newest step, 12, does not read")


def test_export_refuses_a_non_empty_out_without_force(tmp_path, trained_run):
    """(What `--force` then does, a whole `cvae export` into a non-empty folder that keeps the
    folder's own files, is tests/test_export_card.py's model-index test: one export
    subprocess for both.)"""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    one_line_error(cvae("export", "--checkpoint-dir", trained_run.directory, "--out", out),
                   "is not empty", "--force")
    assert {p.name for p in out.iterdir()} == {"notes.txt"}
