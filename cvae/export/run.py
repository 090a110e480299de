"""`cvae export --checkpoint-dir C --out DIR`: one self-describing folder, verified.

The folder is written into a staging folder beside DIR, every artefact is checked against the
JAX sampler there (`verify`), and only then are the files moved into DIR, the manifest last.
Refused with one line (ExportError / CheckpointError): a missing checkpoint, one still being
written or whose newest step does not read, and a DIR that is not empty without `force`. With
`force`, the files of an export replace those in DIR; other files there are left alone.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from cvae.config.sections import Config, as_flags
from cvae.errors import ConfigError
from cvae.errors import CheckpointError, ExportError
from cvae.export import card, compiled, onnx_files, stablehlo
from cvae.export.functions import exact_functions, onnx_functions
from cvae.export.config_file import CONFIG, config_json, spec_facts
from cvae.export.manifest import MANIFEST, read_manifest, write_manifest
from cvae.export.weights import WEIGHTS, flatten, load_weights, save_weights
from cvae.model.store import PARTIAL_STEP_SUFFIX, read_record
from cvae.sampling.grid import _to_uint8
from cvae.sampling.latents import request_latents
from cvae.training.record import cpu_name
from cvae.data.specs import spec_of

COMMITTED = "_CHECKPOINT_METADATA"  # what Orbax writes into every committed step
SAMPLES = "samples.png"
ONNX_ROWS_PER_DIGIT = 1000  # the noise vectors per digit ONNX Runtime is checked on


def export_checkpoint(checkpoint_dir: str | Path, out: str | Path, *, force: bool = False,
                      truncation: float | None = None, step="latest", log=print,
                      compiled_programs: bool = False) -> dict:
    """Export the newest step of `checkpoint_dir` (or the one `step` chooses:
    `cvae.model.store.StepChoice`) into `out`, drawing at `truncation` (None: the run's own;
    `Config.drawn_at`); returns the manifest. `compiled_programs`: carry the programs a server's
    start compiles on this kind of machine (cvae/export/compiled.py; `cvae export` does)."""
    checkpoint_dir, out = Path(checkpoint_dir), Path(out)
    check_out(out, checkpoint_dir, force=force)
    checkpoint = finished_checkpoint(checkpoint_dir, step)
    from cvae.model.registry import create_model
    from cvae.sampling.sampler import create_sampler

    config = checkpoint.config.drawn_at(truncation)
    sampler = create_sampler(create_model(config), config, checkpoint.variables,
                             step=checkpoint.step)
    sampler.check_blocks()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-export-", dir=out.parent))
    try:
        manifest = write_folder(staging, sampler, checkpoint_dir, name=out.name, log=log,
                                run_config=checkpoint.config)
        if compiled_programs:
            log("exporting: the programs a start compiles on this machine")
            manifest = compiled.carry(staging, manifest)
        move_into(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def check_out(out: Path, checkpoint_dir: Path, *, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file, not a folder")
    resolved, source = out.resolve(), checkpoint_dir.resolve()
    if resolved == source or source.is_relative_to(resolved):
        raise ExportError(f"--out {out} holds the checkpoint directory {checkpoint_dir}: "
                          f"export into a folder of its own")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"--out {out} is not empty: pass --force to replace the exported "
                          f"files in it, or choose an empty or new folder")


def finished_checkpoint(directory: Path, step="latest"):
    """The newest (or the chosen) step of `directory`, refused when a step is still being
    written, or when the newest one is uncommitted or does not read (where
    `load_trained_model` would quietly fall back to an older step)."""
    from cvae.model.store import READ_ERRORS, load_trained_model

    steps = []
    if directory.is_dir():
        pending = sorted(p.name for p in directory.iterdir() if PARTIAL_STEP_SUFFIX in p.name)
        if pending:
            raise CheckpointError(f"{directory} has a checkpoint still being written "
                                  f"({pending[0]}): let the save finish (or training stop), "
                                  f"then export")
        steps = [int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir()]
    if not steps or step != "latest":
        # Its one-line CheckpointError says what to do, or which steps there are.
        return load_trained_model(directory, step)
    newest = max(steps)
    hint = (f"{directory}: the newest step, {newest}, does not read (unfinished or damaged): "
            f"move it away to export the step before it")
    if not (directory / str(newest) / COMMITTED).is_file():
        raise CheckpointError(hint)
    try:
        return load_trained_model(directory, newest)
    except READ_ERRORS as error:
        raise CheckpointError(f"{hint} ({str(error).splitlines()[0]})") from None


def write_folder(folder: Path, sampler, checkpoint_dir: Path, *, name: str, log,
                 run_config) -> dict:
    """Every file of the export in `folder`, verified, the manifest last. `run_config`: the
    run's own config, which drew an `eval.json` that does not say how it drew."""
    step, config = sampler.step, sampler.config
    save_weights(folder / WEIGHTS, sampler.variables, {"format": "cvae", "step": str(step)})
    (folder / CONFIG).write_text(config_json(config) + "\n")
    (folder / SAMPLES).write_bytes(sampler.sample_png(None, 8, 0, scale=2))
    log(f"exporting step {step} of {checkpoint_dir}: StableHLO")
    stablehlo.write_stablehlo(folder, exact_functions(sampler))
    log("exporting: ONNX (jax2onnx)")
    onnx_files.write_onnx(folder, onnx_functions(sampler))
    log("verifying against the JAX sampler")
    report = verify(folder, sampler)
    eval_results, eval_note = eval_figures(checkpoint_dir, step, config=config,
                                          run_config=run_config)
    sizes = {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()}
    record = read_record(checkpoint_dir, step)
    facts = card.CardFacts(name, step, config, sizes, eval_results, eval_note, report,
                           sampler.has_classifier, record)
    (folder / "README.md").write_text(card.model_card(facts))
    return write_manifest(folder, {"step": step, "checkpoint_dir": str(checkpoint_dir),
                                   "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                   "jax_version": jax.__version__, "onnx_opset": onnx_files.OPSET,
                                   "noise_dim": sampler.noise_dim, "code_dim": sampler.code_dim,
                                   **spec_facts(config), "verification": report,
                                   "record": record})


def verify(folder: Path, sampler) -> dict:
    """The weights read back, StableHLO's bits and ONNX Runtime's tolerance (module doc)."""
    stored = flatten(load_weights(folder / WEIGHTS))
    expected = flatten(sampler.variables)
    if stored.keys() != expected.keys() or not all(
            np.array_equal(stored[k], np.asarray(expected[k])) for k in expected):
        raise AssertionError(f"{WEIGHTS} does not read back into the exported variables")
    noise, labels = request_latents(0, sampler.classes, ONNX_ROWS_PER_DIGIT,
                                    noise_width=sampler.noise_dim, temperature=1.0)
    def ends(block_sizes):  # the smallest and largest size each group kept
        return sorted({min(block_sizes), max(block_sizes)})

    sizes, coding = ends(sampler.block_sizes), ends(sampler.code_block_sizes)
    # each group's blocks are checked on their own
    reading = ends(sampler.classify_block_sizes) if sampler.has_classifier else []
    count = max(1000, *sizes, *coding, *reading)  # digits (the sampler's own) to read back
    digits = _to_uint8(sampler.decode(noise[:count], labels[:count]),
                       spec_of(sampler.config.data.dataset).stored_shape)
    rows = {}
    for size in sorted({*sizes, *coding, *reading}):
        images = digits[:size].reshape(size, -1).astype(np.float32) / np.float32(255)
        inputs = {"sample": (noise[:size], labels[:size])} if size in sizes else {}
        if size in coding:
            inputs["encode"] = (images, labels[:size])
        if size in reading:
            inputs["classify"] = (images,)
        for name, compared in stablehlo.verify_stablehlo(folder, sampler, inputs).items():
            rows[name] = rows.get(name, 0) + compared
    onnx = onnx_files.verify_onnx(folder, sampler, noise=noise, labels=labels, digits=digits)
    return {"stablehlo_rows": rows, "stablehlo_block_sizes": sorted({*sizes, *coding, *reading}),
            "onnx": onnx,
            "cpu": cpu_name()}


def eval_figures(checkpoint_dir: Path, step: int, *, config,
                 run_config) -> tuple[dict | None, str]:
    """`cvae eval`'s JSON for this step (checkpoint_dir/eval.json, `make eval`'s), where its
    samples were drawn as the export's `config` draws them, and a note saying where the card's
    figures come from or why it has none. A JSON that does not say how it drew (written before
    `cvae eval` recorded its config) drew as `run_config`, the run's own."""
    path = checkpoint_dir / "eval.json"
    command = f"`cvae eval --checkpoint-dir {checkpoint_dir} --json {path}` (`make eval`)"
    if not path.is_file():
        return None, f"{path} did not exist at export; run {command}, then export again"
    try:
        results = json.loads(path.read_text())
    except ValueError as error:
        return None, f"{path} did not read ({error}); run {command}, then export again"
    if not isinstance(results, dict):
        return None, f"{path} did not read (not an object); run {command}, then export again"
    if results.get("step") != step:
        return None, (f"{path} is of step {results.get('step')}, not the exported step "
                      f"{step}; run {command}, then export again")
    scored = results.get("config")
    if scored is None:  # written before `cvae eval` recorded its config: the run's drawing
        scored = run_config.to_dict()
    try:
        drawn = Config.from_dict(scored).drawing_dict() if isinstance(scored, dict) else None
    except ConfigError:
        drawn = None
    if drawn is None:
        return None, f"{path} did not read (its config is not one); run {command}, then " \
                     f"export again"
    if drawn != config.drawing_dict():
        # the exact values, which `cvae eval` records as given (`:g` would round them)
        flags = " ".join(as_flags({f"drawing.{name}": value
                                   for name, value in config.drawing_dict().items()}))
        return None, (f"{path} scored samples drawn with {_drawing_text(drawn)}, this export "
                      f"draws with {_drawing_text(config.drawing_dict())}; run `cvae eval "
                      f"--checkpoint-dir {checkpoint_dir} --json {path} {flags}`, then export "
                      f"again")
    return results, (f"From `cvae eval` ({path}) on {results.get('test_examples')} test "
                     f"examples")


def _drawing_text(drawing: dict) -> str:
    """{"pixel_sharpness": 1.3, "truncation": 0.75} -> "pixel_sharpness 1.3, truncation 0.75"."""
    return ", ".join(f"{name} {value!r}" for name, value in drawing.items())


def move_into(staging: Path, out: Path) -> None:
    """The staged files into `out`, the manifest last; files a previous export there listed
    but this one has not are removed (other files are left alone)."""
    try:
        previous = set(read_manifest(out)["files"]) if (out / MANIFEST).is_file() else set()
    except CheckpointError:  # a damaged manifest: its files are replaced all the same
        previous = set()
    out.mkdir(exist_ok=True)
    names = sorted(p.name for p in staging.iterdir())
    for stale in previous - set(names):
        (out / stale).unlink(missing_ok=True)
    umask = os.umask(0)
    os.umask(umask)
    for name in sorted(names, key=lambda n: n == MANIFEST):
        os.chmod(staging / name, 0o666 & ~umask)  # safetensors writes 0600: others may read
        os.replace(staging / name, out / name)
