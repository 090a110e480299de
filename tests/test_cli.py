"""The `cvae` command as a user runs it: real subprocesses, real files."""

import subprocess
import sys
import pytest
from PIL import Image

from cvae.cli import build_parser, config_from_args
from synthetic import write_synthetic_idx


def image_size_mode(path):
    with Image.open(path) as image:
        return image.size, image.mode


def cvae(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "cvae.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    write_synthetic_idx(root / "data", num_train=600, num_test=100)
    result = cvae("train", "--data-dir", root / "data", "--checkpoint-dir", root / "ck",
                  "--train-limit", 512, "--max-steps", 50, "--batch-size", 16,
                  "--hidden-sizes", "64,32", "--latent-dim", 4, "--warmup-steps", 0,
                  "--steps-per-call", 10, "--eval-batch-size", 100, "--no-progress")
    assert result.returncode == 0, result.stderr
    return root, result


def test_train_smoke_writes_checkpoint_metrics_and_grid(trained):
    root, result = trained
    assert "trained to step 50" in result.stdout
    ck = root / "ck"
    assert (ck / "50").is_dir()
    assert len((ck / "metrics.jsonl").read_text().splitlines()) == 2  # epoch 1 (32 steps), cut
    assert image_size_mode(ck / "samples_latest.png") == ((10 * 30 + 2, 10 * 30 + 2), "L")


def test_sample_writes_png_of_the_expected_size(trained):
    root, _ = trained
    out = root / "seven.png"
    result = cvae("sample", "--checkpoint-dir", root / "ck", "--digit", 7, "--n", 10,
                  "--scale", 2, "--pad", 3, "--seed", 1, "--out", out)
    assert result.returncode == 0, result.stderr
    cols, rows = 4, 3  # ceil(sqrt(10)) columns
    assert image_size_mode(out) == ((cols * (56 + 3) + 3, rows * (56 + 3) + 3), "L")
    again = root / "seven-again.png"
    cvae("sample", "--checkpoint-dir", root / "ck", "--digit", 7, "--n", 10, "--scale", 2,
         "--pad", 3, "--seed", 1, "--out", again)
    assert again.read_bytes() == out.read_bytes()


def test_sample_without_digit_has_one_row_per_digit(trained):
    root, _ = trained
    out = root / "all.png"
    assert cvae("sample", "--checkpoint-dir", root / "ck", "--n", 3, "--out", out).returncode == 0
    assert image_size_mode(out) == ((3 * 30 + 2, 10 * 30 + 2), "L")


def test_train_again_resumes_and_continues_the_step_count(trained):
    root, _ = trained
    result = cvae("train", "--data-dir", root / "data", "--checkpoint-dir", root / "ck",
                  "--train-limit", 512, "--max-steps", 60, "--batch-size", 16,
                  "--hidden-sizes", "64,32", "--latent-dim", 4, "--warmup-steps", 0,
                  "--steps-per-call", 10, "--eval-batch-size", 100, "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "trained to step 60" in result.stdout


def test_train_on_a_finished_run_does_nothing_and_keeps_the_checkpoint(trained):
    root, _ = trained
    args = ("train", "--data-dir", root / "data", "--checkpoint-dir", root / "ck",
            "--train-limit", 512, "--max-steps", 60, "--batch-size", 16, "--hidden-sizes",
            "64,32", "--latent-dim", 4, "--warmup-steps", 0, "--steps-per-call", 10,
            "--eval-batch-size", 100, "--no-progress")
    assert cvae(*args).returncode == 0  # at step 60, whichever test ran first
    before = {p: p.stat().st_mtime_ns for p in (root / "ck" / "60").rglob("*")}
    result = cvae(*args)  # used to fail: Orbax refused to save step 60 a second time
    assert result.returncode == 0, result.stderr
    assert "nothing to do" in result.stdout and "already at step 60 of 60" in result.stdout
    assert {p: p.stat().st_mtime_ns for p in (root / "ck" / "60").rglob("*")} == before


@pytest.mark.parametrize("args, fragment", [
    (["sample", "--digit", "10", "--out", "x.png"], "--digit: 10 is outside [0, 9]"),
    (["sample", "--digit", "seven", "--out", "x.png"], "--digit: 'seven' is not a valid int"),
    (["sample", "--temperature", "0", "--out", "x.png"], "--temperature: 0.0 is outside (0, 2]"),
    (["sample", "--scale", "50", "--out", "x.png"], "--scale: 50 is outside [1, 8]"),
    (["train", "--likelihood", "poisson"], "invalid choice: 'poisson'"),
])
def test_bad_flags_name_the_flag_and_range(args, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(args)
    assert exit_info.value.code == 2
    assert fragment in capsys.readouterr().err


def test_bad_config_value_is_one_line_naming_the_field(tmp_path):
    result = cvae("train", "--batch-size", 0, "--data-dir", tmp_path, "--checkpoint-dir", tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "cvae train: error: batch_size=0: must be >= 1"


def test_missing_data_is_one_line_saying_what_to_run(tmp_path):
    result = cvae("train", "--data-dir", tmp_path / "nodata", "--checkpoint-dir", tmp_path / "ck")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "cvae data" in result.stderr and "Traceback" not in result.stderr


def test_empty_checkpoint_dir_is_one_line_saying_what_to_run(tmp_path):
    result = cvae("sample", "--checkpoint-dir", tmp_path, "--out", tmp_path / "x.png")
    assert result.returncode == 2
    assert "no checkpoint in" in result.stderr and "make train" in result.stderr
    assert "Traceback" not in result.stderr


def test_every_config_field_is_a_train_flag():
    args = build_parser().parse_args(["train", "--preset", "seed", "--kl-weight", "0.25",
                                      "--batch-norm", "--hidden-sizes", "8,4"])
    config = config_from_args(args)
    assert config.kl_weight == 0.25 and config.batch_norm and config.hidden_sizes == (8, 4)
    assert config.latent_dim == 32  # the rest comes from the preset
