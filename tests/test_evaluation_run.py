"""Evaluation: exact test-set averages of the training objective, and `cvae eval` end to end on a
tiny trained run (table, JSON with every figure, report PNGs)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from cvae import config as config_lib
from cvae.evaluation import reports
from cvae.cli import main
from cvae.evaluation.run import create_eval_step, evaluate
from cvae.sampling.grid import grid_shape
from cvae.model.networks import create_model, init_variables
from cvae.data.synthetic import synthetic_dataset, write_synthetic_idx
from cvae.training.step import run_key


def test_evaluation_weights_an_unequal_last_batch_exactly():
    config = config_lib.test().replace(binarization="none")
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    data = synthetic_dataset(16, num_test=50)
    images = jnp.asarray(data.test_images.reshape(-1, 784))
    labels = jnp.asarray(data.test_labels)
    eval_step = create_eval_step(model, config)
    whole = evaluate(eval_step, variables, images, labels, run_key(0), 50, config)
    # z noise differs per batch, so compare with the deterministic part: the KL
    pieces = evaluate(eval_step, variables, images, labels, run_key(0), 16, config)
    assert pieces["kl"] == pytest.approx(whole["kl"], rel=1e-5)
    assert pieces["active_units"] == whole["active_units"]


def test_evaluation_loss_is_the_training_objective_with_free_bits():
    """With free bits above every dimension's KL, the KL term of the loss is latent_dim x the
    floor, exactly as in training; the reported KL stays unfloored."""
    config = config_lib.test().replace(binarization="none", kl_weight=2.0, free_bits=50.0)
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    data = synthetic_dataset(16, num_test=40)
    images = jnp.asarray(data.test_images.reshape(-1, 784))
    labels = jnp.asarray(data.test_labels)
    metrics = evaluate(create_eval_step(model, config), variables, images, labels, run_key(0), 16,
                       config)
    assert metrics["kl"] < 50.0
    assert metrics["loss"] == pytest.approx(
        metrics["reconstruction"] + 2.0 * config.latent_dim * 50.0, rel=1e-6)
    plain = evaluate(create_eval_step(model, config.replace(free_bits=0.0)), variables, images,
                     labels, run_key(0), 16, config.replace(free_bits=0.0))
    assert plain["loss"] == pytest.approx(plain["reconstruction"] + 2.0 * plain["kl"], rel=1e-6)


def test_eval_writes_json_table_and_reports(trained_run, tmp_path, capsys):
    data_dir = tmp_path / "data"
    write_synthetic_idx(data_dir, num_train=512, num_test=64)
    out = tmp_path / "out" / "eval.json"
    code = main(["eval", "--checkpoint-dir", str(trained_run.directory), "--data-dir",
                 str(data_dir), "--json", str(out), "--iwae-k", "8", "--iwae-k-marginal", "2",
                 "--iwae-chunk", "4", "--iwae-limit", "40", "--samples-per-digit", "6"])
    assert code == 0
    table = capsys.readouterr().out
    assert "-log p(x|y), IWAE K=8" in table and "Fréchet" in table
    results = json.loads(out.read_text())
    assert results["step"] == trained_run.steps[-1]
    bound = results["iwae"]
    assert bound["k"] == 8 and bound["marginal_check"]["ok"]
    assert bound["nll_marginal"] <= bound["nll_conditional"] + np.log(10) + 1e-3
    assert bound["examples"] == 40  # --iwae-limit: the bounds on a subset, the rest on all 64
    assert bound["bayes_rule"]["k"] == 2 and 0 <= bound["bayes_rule"]["error"] <= 1
    assert "argmax_y p(x|y) error, K=2" in table
    # K=8 is at least as tight as the single-sample ELBO on average (up to binarisation noise).
    assert bound["nll_conditional"] < results["elbo"]["neg_elbo"] + 5
    assert 0 <= results["elbo"]["active_units"] <= trained_run.config.latent_dim
    fid = results["fidelity"]
    assert len(fid["samples"]["accuracy_per_digit"]) == 10
    assert 0 <= fid["samples"]["accuracy"] <= 1 and fid["real"]["fd"] >= 0
    assert (data_dir / "classifier").is_dir()  # cached beside the data
    rebuilt = fid["reconstructions"]
    assert rebuilt["digits"] == 32 and 0 <= rebuilt["recall"] <= 1
    assert rebuilt["fd_ratio"] == pytest.approx(fid["samples"]["fd"] / rebuilt["fd"])
    assert "reconstructions (32 test digits)" in table
    swap = results["label_swap"]
    assert swap["swaps"] == 9 * 64 and 0 <= swap["accuracy"] <= 1
    assert "label swap (64 digits x 9 labels)" in table and "style survival r" in table
    for name, (cols, rows) in reports.report_shapes().items():
        path = out.parent / name
        assert path.is_file()
        height, width = grid_shape(cols * rows, cols, reports.SCALE, reports.PAD)
        with Image.open(path) as image:
            assert image.size == (width, height)


def test_eval_of_gaussian_likelihood_skips_iwae_with_a_note(trained_run, tmp_path, capsys):
    from cvae.training.checkpoints import load_checkpoint
    from cvae.evaluation.run import EvalOptions, evaluate_checkpoint

    checkpoint = load_checkpoint(trained_run.directory)
    checkpoint.config = checkpoint.config.replace(likelihood="gaussian")
    results = evaluate_checkpoint(checkpoint, synthetic_dataset(64, 32),
                                  EvalOptions(fidelity=False), None)
    assert results["iwae"] is None and "bernoulli" in results["iwae_note"]


def test_eval_of_empty_directory_is_one_line_error(tmp_path, capsys):
    code = main(["eval", "--checkpoint-dir", str(tmp_path / "none"), "--data-dir",
                 str(tmp_path)])
    assert code != 0
    assert "no checkpoint" in capsys.readouterr().err


def test_eval_scores_a_baseline_in_the_same_run(trained_run, tmp_path, capsys):
    """--baseline-dir: the baseline's samples scored with the same classifier and reference,
    and the FD ratio; scoring the run against itself gives exactly 1."""
    data_dir = tmp_path / "data"
    write_synthetic_idx(data_dir, num_train=512, num_test=64)
    out = tmp_path / "eval.json"
    code = main(["eval", "--checkpoint-dir", str(trained_run.directory), "--data-dir",
                 str(data_dir), "--json", str(out), "--iwae-k", "0", "--samples-per-digit", "6",
                 "--baseline-dir", str(trained_run.directory), "--report-dir",
                 str(tmp_path / "reports")])
    assert code == 0
    assert "ours / baseline FD = 1.000" in capsys.readouterr().out
    fid = json.loads(out.read_text())["fidelity"]
    assert fid["baseline"]["samples"] == fid["samples"]
    assert fid["baseline"]["fd_ratio"] == 1.0 and not fid["baseline"]["fd_ratio_met"]


def test_eval_baseline_needs_fidelity(trained_run, tmp_path, capsys):
    code = main(["eval", "--checkpoint-dir", str(trained_run.directory), "--data-dir",
                 str(tmp_path), "--no-fidelity", "--baseline-dir", str(trained_run.directory)])
    assert code != 0
    assert "--baseline-dir" in capsys.readouterr().err
