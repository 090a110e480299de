"""The exported folder's README.md (cvae/export/card.py): front matter the Hub's own parser
reads (huggingface_hub), with `model-index` metrics from `cvae eval`'s JSON when the
checkpoint has one, and Python snippets that run as written, one of them with only
onnxruntime and numpy in a Python that cannot import cvae."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from cvae.config import presets
from cvae.export.card import eval_metrics, train_command
from cvae.export.load import load_export
from cvae.model.store import read_record



def snippets(card: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", card, flags=re.S)


def test_the_front_matter_reads_as_a_hub_model_card(exported):
    text = (exported("few-labels") / "README.md").read_text()
    data = ModelCard(text).data
    assert data.library_name == "cvae"
    assert data.license == "apache-2.0"  # the project's LICENSE, as the Hub spells it
    assert {"jax", "flax", "onnx", "safetensors", "stablehlo"} <= set(data.tags)
    assert data.datasets == ["ylecun/mnist"]
    assert data.eval_results is None  # the run had no eval.json: the card says so instead
    assert "eval.json did not exist at export; run `cvae eval" in text
    for heading in ("## Intended use and limitations", "## Training", "## Use it",
                    "## What the export verified", "![one row per class, seed 0](samples.png)"):
        assert heading in text
    assert "`classify` is q(y|x)" in text
    # The run record of the exported step, in the manifest and, in short, in the card.
    manifest = json.loads((exported("few-labels") / "manifest.json").read_text())
    assert manifest["record"] == read_record(manifest["checkpoint_dir"], manifest["step"])
    assert f"jax {manifest['record']['versions']['jax']}" in text.split("## Run record")[1]


@pytest.mark.slow  # a variant's journey end to end: `make test-slow`
def test_the_metrics_of_cvae_eval_go_into_model_index(export_runs, data_dir, tmp_path):
    run = export_runs("few-labels").copy_to(tmp_path / "run")
    evaluated = subprocess.run(
        [sys.executable, "-m", "cvae.cli", "eval", "--checkpoint-dir", run, "--data-dir",
         data_dir, "--json", run / "eval.json", "--no-fidelity", "--iwae-k", "10",
         "--iwae-k-marginal", "0", "--test-limit", "32"],
        capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    # Into a folder that holds a file of its own, with --force (tests/test_export.py's refusal
    # without it): only the export's files are replaced.
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "notes.txt").write_text("mine")
    exported = subprocess.run(
        [sys.executable, "-m", "cvae.cli", "export", "--checkpoint-dir", run, "--out",
         tmp_path / "model", "--force"], capture_output=True, text=True, timeout=600)
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert "StableHLO bit-identical" in exported.stdout
    assert (tmp_path / "model" / "notes.txt").read_text() == "mine"
    assert load_export(tmp_path / "model").step == max(export_runs("few-labels").steps)
    results = json.loads((run / "eval.json").read_text())
    card = ModelCard((tmp_path / "model" / "README.md").read_text())
    found = {(r.metric_type, r.metric_name): r.metric_value for r in card.data.eval_results}
    assert found[("neg_elbo", "negative ELBO (nats)")] == pytest.approx(
        results["elbo"]["neg_elbo"], rel=1e-5)
    assert found[("nll", "-log p(x|y), IWAE K=10 (nats)")] == pytest.approx(
        results["iwae"]["nll_conditional"], rel=1e-5)
    assert found[("error_rate", "q(y|x) test error")] == pytest.approx(
        results["classification"]["q_y_given_x"]["error"])
    assert all(r.dataset_type == "ylecun/mnist" and r.dataset_split == "test"
               for r in card.data.eval_results)
    assert f"From `cvae eval` ({run / 'eval.json'}) on 32 test examples" in card.text


def test_eval_figures_of_another_step_or_drawing_are_not_claimed(tmp_path):
    from cvae.export.run import eval_figures

    own = presets.test()
    redrawn = own.replace(truncation=0.7777777)  # the command must give it exactly
    figures, note = eval_figures(tmp_path, 8, config=own, run_config=own)
    assert figures is None and "did not exist" in note
    (tmp_path / "eval.json").write_text("[8]")
    figures, note = eval_figures(tmp_path, 8, config=own, run_config=own)
    assert figures is None and "did not read (not an object)" in note
    (tmp_path / "eval.json").write_text(json.dumps({"step": 4, "elbo": {"neg_elbo": 1.0}}))
    figures, note = eval_figures(tmp_path, 8, config=own, run_config=own)
    assert figures is None and "is of step 4, not the exported step 8" in note
    # Written before `cvae eval` recorded its config: drawn as the run draws.
    unrecorded = {"step": 8, "elbo": {"neg_elbo": 1.0}}
    (tmp_path / "eval.json").write_text(json.dumps(unrecorded))
    assert eval_figures(tmp_path, 8, config=own, run_config=own)[0] == unrecorded
    figures, note = eval_figures(tmp_path, 8, config=redrawn, run_config=own)
    assert figures is None and "this export draws with truncation 0.7777777, " in note
    assert note.endswith("--truncation 0.7777777 --pixel-sharpness 1.3`, then export again")
    # Recorded: its own drawing decides, whatever the run's.
    scored = {"step": 8, "config": redrawn.to_dict(), "elbo": {"neg_elbo": 1.0}}
    (tmp_path / "eval.json").write_text(json.dumps(scored))
    assert eval_figures(tmp_path, 8, config=redrawn, run_config=own)[0] == scored
    assert eval_figures(tmp_path, 8, config=own, run_config=own)[0] is None
    for wrong in ([0.75], [], 0):  # even a falsy one is not read as "none recorded"
        (tmp_path / "eval.json").write_text(json.dumps({**scored, "config": wrong}))
        figures, note = eval_figures(tmp_path, 8, config=own, run_config=own)
        assert figures is None and "did not read (its config is not one)" in note
    assert eval_metrics({"elbo": {"neg_elbo": 1.0}, "iwae": None}) == [
        ("neg_elbo", "negative ELBO (nats)", 1.0)]


def test_the_training_command_rebuilds_the_config():
    config = presets.semi()
    command = train_command(config)
    # The flags in the sections' order (data, model, prior, ..., labels, drawing).
    assert command == "cvae train --validation-size 10000 --prior-components 10 " \
                      "--prior-codes means --epochs 15 --eval-every 1 " \
                      "--labels 100 --classifier-weight 5.0 --classifier-shift 2 " \
                      "--consistency-weight 20.0 --entropy-weight 1.0 --vat-weight 3.0 " \
                      "--vat-epsilon 2.0 --truncation 1.0 --pixel-sharpness 1.0"
    from cvae.cli.main import build_parser, config_from_args

    args = build_parser().parse_args(command.split()[1:])
    assert config_from_args(args) == config


def run_snippet(code: str, cwd: Path, python: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([*python, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_every_snippet_runs_as_written(exported, tmp_path):
    folder = shutil.copytree(exported("mixture"), tmp_path / "model")
    blocks = snippets((folder / "README.md").read_text())
    assert len(blocks) == 4
    for code in blocks:
        result = run_snippet(code, folder, [sys.executable])
        assert result.returncode == 0, (code, result.stderr[-2000:])
    assert (folder / "class-7.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_onnxruntime_snippet_needs_only_onnxruntime_and_numpy(exported, tmp_path):
    """In an isolated Python (-I: no user site, no PYTHONPATH; -S: no site-packages, so no
    editable cvae either) given only the site-packages folder, outside the repository."""
    folder = shutil.copytree(exported("mixture"), tmp_path / "model")
    code = next(block for block in snippets((folder / "README.md").read_text())
                if "onnxruntime" in block)
    assert "cvae" not in code
    prelude = (f"import sys; sys.path.append({sysconfig.get_paths()['purelib']!r}); "
               f"import importlib.util; assert importlib.util.find_spec('cvae') is None; "
               f"assert importlib.util.find_spec('jax') is not None\n")
    result = run_snippet(prelude + code, folder, [sys.executable, "-I", "-S"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("(16, 28, 28) uint8 ")
    blocked = run_snippet("import sys; sys.path.append("
                          f"{sysconfig.get_paths()['purelib']!r}); import cvae", folder,
                          [sys.executable, "-I", "-S"])
    assert blocked.returncode != 0 and "No module named 'cvae'" in blocked.stderr
