"""`cvae eval` end to end on a tiny trained run (table, JSON with every figure, report PNGs)."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
from PIL import Image

from cvae.evaluation import reports
from cvae.evaluation.fidelity import label_counts_like
from cvae.cli.main import main
from cvae.model.store import read_record
from cvae.sampling.grid import grid_shape
from cvae.data.synthetic import synthetic_dataset


def test_eval_writes_json_table_and_reports(trained_run, eval_data_dir, tmp_path, capsys):
    out = tmp_path / "out" / "eval.json"
    code = main(["eval", "--checkpoint-dir", str(trained_run.directory), "--data-dir",
                 str(eval_data_dir), "--json", str(out), "--iwae-k", "8", "--iwae-k-marginal",
                 "2", "--iwae-chunk", "4", "--iwae-limit", "40", "--samples-per-digit", "6"])
    assert code == 0
    captured = capsys.readouterr()
    table = captured.out
    assert "-log p(x|y), IWAE K=8" in table and "Fréchet" in table
    # The classifier cached beside the data (DATA_DIR/classifier) is read, not trained again.
    assert "training the fidelity classifier" not in captured.err
    results = json.loads(out.read_text())
    assert results["step"] == trained_run.steps[-1]
    # The run record of the step scored (cvae/training/record.py) comes along.
    assert results["record"] == read_record(trained_run.directory, trained_run.steps[-1])
    assert results["record"]["versions"]["jax"] == jax.__version__
    bound = results["iwae"]
    assert bound["k"] == 8 and bound["marginal_check"]["ok"]
    assert bound["nll_marginal"] <= bound["nll_conditional"] + np.log(10) + 1e-3
    assert bound["examples"] == 40  # --iwae-limit: the bounds on a subset, the rest on all 64
    assert bound["bayes_rule"]["k"] == 2 and 0 <= bound["bayes_rule"]["error"] <= 1
    assert "argmax_y p(x|y) error, K=2" in table
    # K=8 is at least as tight as the single-sample ELBO on average (up to binarisation noise).
    assert bound["nll_conditional"] < results["elbo"]["neg_elbo"] + 5
    assert 0 <= results["elbo"]["active_units"] <= trained_run.config.model.options.latent_dim
    fid = results["fidelity"]
    assert len(fid["samples"]["accuracy_per_digit"]) == 10
    assert 0 <= fid["samples"]["accuracy"] <= 1 and fid["real"]["fd"] >= 0
    # 60 samples, split among the labels as the reference (odd) half's 32 digits are.
    reference_labels = synthetic_dataset(512, 64).test_labels[1::2]
    assert fid["samples"]["label_counts"] == label_counts_like(reference_labels, 60,
                                                               num_classes=10).tolist()
    rebuilt = fid["reconstructions"]
    assert rebuilt["digits"] == 32 and 0 <= rebuilt["recall"] <= 1
    assert rebuilt["fd_ratio"] == pytest.approx(fid["samples"]["fd"] / rebuilt["fd"])
    assert "reconstructions (32 test digits)" in table
    swap = results["label_swap"]
    assert swap["swaps"] == 9 * 64 and 0 <= swap["accuracy"] <= 1
    assert "label swap (64 digits x 9 labels)" in table and "style survival r" in table
    for name, (cols, rows) in reports.report_shapes(10).items():
        path = out.parent / name
        assert path.is_file()
        height, width = grid_shape(cols * rows, cols, scale=reports.SCALE, pad=reports.PAD)
        with Image.open(path) as image:
            assert image.size == (width, height)


def test_eval_of_gaussian_likelihood_skips_iwae_with_a_note(trained_run, tmp_path, capsys):
    from cvae.evaluation.run import EvalOptions, evaluate_checkpoint
    from cvae.model.store import load_trained_model

    checkpoint = load_trained_model(trained_run.directory)
    checkpoint = dataclasses.replace(checkpoint,
                                     config=checkpoint.config.replace(likelihood="gaussian"))
    results = evaluate_checkpoint(checkpoint, synthetic_dataset(64, 32),
                                  EvalOptions(fidelity=False), classifier_dir=None)
    assert results["iwae"] is None and "bernoulli" in results["iwae_note"]


def test_eval_of_empty_directory_is_one_line_error(tmp_path, capsys):
    code = main(["eval", "--checkpoint-dir", str(tmp_path / "none"), "--data-dir",
                 str(tmp_path)])
    assert code != 0
    assert "no checkpoint" in capsys.readouterr().err


def test_eval_scores_a_baseline_in_the_same_run(trained_run, eval_data_dir, tmp_path, capsys):
    """--baseline-dir: the baseline's samples scored with the same classifier and reference,
    and the FD ratio; scoring the run against itself gives exactly 1."""
    out = tmp_path / "eval.json"
    code = main(["eval", "--checkpoint-dir", str(trained_run.directory), "--data-dir",
                 str(eval_data_dir), "--json", str(out), "--iwae-k", "0",
                 "--samples-per-digit", "6", "--baseline-dir", str(trained_run.directory),
                 "--report-dir", str(tmp_path / "reports")])
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


def test_eval_pixel_sharpness_redraws_the_pictures_and_keeps_the_bounds(trained_run,
                                                                        eval_data_dir, tmp_path,
                                                                        capsys):
    """--pixel-sharpness 3 draws the samples sharper than the checkpoint's own (its baseline
    here: the same run as it is), and every bound is the one of an eval without the flag."""
    common = ["eval", "--checkpoint-dir", str(trained_run.directory), "--data-dir",
              str(eval_data_dir), "--iwae-k", "4", "--iwae-limit", "8", "--iwae-k-marginal", "2",
              "--samples-per-digit", "6", "--report-dir", str(tmp_path / "reports")]
    sharp, plain = tmp_path / "sharp.json", tmp_path / "plain.json"
    assert main([*common, "--pixel-sharpness", "3", "--baseline-dir",
                 str(trained_run.directory), "--balanced-samples", "--json", str(sharp)]) == 0
    assert main([*common, "--no-fidelity", "--json", str(plain)]) == 0
    sharp, plain = json.loads(sharp.read_text()), json.loads(plain.read_text())
    for name in ("elbo", "iwae"):  # every figure but the time each took
        assert ({k: v for k, v in sharp[name].items() if k != "seconds"}
                == {k: v for k, v in plain[name].items() if k != "seconds"})
    fid = sharp["fidelity"]
    assert fid["samples"]["grey_share"] < fid["baseline"]["samples"]["grey_share"]
    assert fid["samples"]["label_counts"] == fid["baseline"]["samples"]["label_counts"] == [6] * 10
    assert "grey pixels" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        main([*common, "--pixel-sharpness", "0"])
    assert refused.value.code == 2
    assert "--pixel-sharpness: 0.0 is outside (0, 10]" in capsys.readouterr().err


def test_balanced_samples_are_the_sampler_grid_of_n_a_digit_and_the_default_draws_the_data_mix(
        trained_run):
    """--balanced-samples scores exactly `sample_images(None, n, seed)` (the protocol before);
    without it, each digit's samples are the first ones of the same digit's draw, as many as the
    reference's proportions give it."""
    from cvae.evaluation import fidelity
    from cvae.evaluation.run import EvalOptions, sample_scores
    from cvae.model.registry import create_model
    from cvae.model.store import load_trained_model
    from cvae.sampling.sampler import create_sampler

    data = synthetic_dataset(512, 64)
    classifier = fidelity.load_or_train_classifier(data, None, epochs=1, log=lambda _: None)
    checkpoint = load_trained_model(trained_run.directory)
    reference_labels = np.asarray(data.test_labels[1::2])
    _, reference = classifier.logits_and_features(data.test_images[1::2])
    scored = {balanced: sample_scores(checkpoint, classifier, reference_features=reference,
                                      reference_labels=reference_labels,
                                      options=EvalOptions(samples_per_digit=6,
                                                          balanced_samples=balanced))
              for balanced in (True, False)}
    sampler = create_sampler(create_model(checkpoint.config), checkpoint.config,
                             checkpoint.variables, step=checkpoint.step, block_rows=500)
    grid = sampler.sample_images(None, 6, 0)
    expected = fidelity.score_images(classifier, grid, np.repeat(np.arange(10), 6),
                                     reference_features=reference,
                                     reference_labels=reference_labels)
    # assert_equal: a digit with too few samples for a covariance has FD nan in both.
    np.testing.assert_equal(scored[True], {**expected, "per_digit": 6, "label_counts": [6] * 10,
                                           "temperature": 1.0})
    counts = label_counts_like(reference_labels, 60, num_classes=10)
    assert scored[False]["label_counts"] == counts.tolist() and counts.sum() == 60
    longest = sampler.sample_images(None, int(counts.max()), 0).reshape(10, -1, 28, 28)
    mixed = np.concatenate([longest[digit, :n] for digit, n in enumerate(counts)])
    expected = fidelity.score_images(classifier, mixed, np.repeat(np.arange(10), counts),
                                     reference_features=reference,
                                     reference_labels=reference_labels)
    np.testing.assert_equal(scored[False], {**expected, "per_digit": 6,
                                            "label_counts": counts.tolist(), "temperature": 1.0})


def test_by_default_the_samples_are_as_many_as_the_reference_half_holds():
    """A Fréchet distance grows as its sets shrink: on a small test set the samples match the
    reference half's size (and its labels' mix), so that their FD and the real halves' are
    comparable; a large one keeps 500 a label; a count given is kept as given."""
    from cvae.evaluation.run import EvalOptions, sample_counts

    small = np.arange(180) % 10  # scikit-learn's digits: a half of about 180 test images
    counts = sample_counts(small, EvalOptions(), num_classes=10)
    assert counts.sum() == 180 and counts.tolist() == label_counts_like(
        small, 180, num_classes=10).tolist()
    uneven = np.array([0] * 97 + [1] * 3 + [2] * 1)  # 101 images, rounding kept out
    assert sample_counts(uneven, EvalOptions(), num_classes=3).sum() == 101
    large = np.arange(5000) % 10  # MNIST's half: 500 a label, as before
    assert sample_counts(large, EvalOptions(), num_classes=10).sum() == 5000
    assert sample_counts(np.arange(20000) % 10, EvalOptions(), num_classes=10).sum() == 5000
    assert sample_counts(small, EvalOptions(samples_per_digit=300),
                         num_classes=10).sum() == 3000
    assert sample_counts(small, EvalOptions(balanced_samples=True),
                         num_classes=10).tolist() == [18] * 10
