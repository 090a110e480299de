"""The validation split: disjoint, stable, MNIST's own; training reads validation, never test."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from cvae.config import sections as config_lib
from cvae.config import presets
from cvae.training.callbacks import Callback, Checkpointer, NanGuard
from cvae.training.checkpoints import load_checkpoint
from cvae.config.sections import ConfigError
from cvae.data.load import raw_dir_of
from cvae.data.idx import TEST_IMAGES, TEST_LABELS
from cvae.training.loop import train_and_evaluate
from cvae.data.splits import split_training_set, training_size, validation_indices
from cvae.data.synthetic import synthetic_dataset, write_synthetic_idx


def test_mnist_validation_is_the_source_validation_set_at_the_end():
    # The IDX training file is the source's 50,000 training images, then its 10,000 validation.
    np.testing.assert_array_equal(validation_indices(60000, 10000, dataset="mnist", seed=7),
                                  np.arange(50000, 60000))


@pytest.mark.parametrize("dataset", ["mnist", "fashion_mnist"])
def test_split_is_disjoint_complete_and_stable(dataset):
    data = synthetic_dataset(200)
    config = presets.test().replace(dataset=dataset, validation_size=50, seed=3)
    images = data.train_images.copy()
    images[:, 0, 0] = np.arange(200)  # stamp each image with its index
    first = split_training_set(images, data.train_labels, config)
    again = split_training_set(images, data.train_labels, config)
    train_ids, validation_ids = first.train_images[:, 0, 0], first.validation_images[:, 0, 0]
    assert len(validation_ids) == 50 and len(train_ids) == 150
    assert not set(train_ids) & set(validation_ids)
    assert sorted({*train_ids, *validation_ids}) == list(range(200))
    for name in ("train_images", "train_labels", "validation_images", "validation_labels"):
        np.testing.assert_array_equal(getattr(first, name), getattr(again, name))


def test_seeded_split_depends_on_the_seed_only_and_is_pinned():
    a = validation_indices(1000, 10, dataset="fashion_mnist", seed=0)
    assert np.array_equal(a, validation_indices(1000, 10, dataset="fashion_mnist", seed=0))
    assert not np.array_equal(a, validation_indices(1000, 10, dataset="fashion_mnist", seed=1))
    # A fixed hash (splitmix64), not a library RNG: the split cannot change with a version.
    assert a.tolist() == PINNED_SEED_0


PINNED_SEED_0 = [233, 250, 286, 453, 509, 728, 744, 781, 844, 899]


def test_train_limit_cuts_the_training_part_only():
    data = synthetic_dataset(100)
    config = presets.test().replace(validation_size=20, train_limit=30)
    split = split_training_set(data.train_images, data.train_labels, config)
    assert len(split.train_images) == 30 and len(split.validation_images) == 20
    assert training_size(100, config) == 30
    assert training_size(100, config.replace(train_limit=0)) == 80
    np.testing.assert_array_equal(split.train_images, data.train_images[:30])


def test_validation_size_out_of_range_names_the_field():
    data = synthetic_dataset(100)
    for size in (0, 100):
        with pytest.raises(ConfigError, match=f"validation_size={size}"):
            split_training_set(data.train_images, data.train_labels,
                               presets.test().replace(validation_size=size))


def test_a_config_without_the_field_is_one_from_before_the_split():
    """A flat config (the form checkpoints were stored in before the config was nested)
    without the field was written before the split: it trained on the whole training file."""
    flat_file = Path(__file__).parent / "fixtures" / "flat-configs" / "test.toml"
    stored = tomllib.loads(flat_file.read_text())
    stored.pop("preset", None)
    del stored["validation_size"]
    assert config_lib.Config.from_dict(stored).data.validation_size == 0


class Untouchable:
    """Stands in for the test set: any use at all fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"training touched the test set ({name})")

    def __array__(self, *args, **kwargs):
        raise AssertionError("training touched the test set (as an array)")

    def __len__(self):
        raise AssertionError("training touched the test set (len)")

    def __getitem__(self, index):
        raise AssertionError("training touched the test set (indexing)")


def test_training_never_reads_the_test_set(tmp_path):
    data = dataclasses.replace(synthetic_dataset(80), test_images=Untouchable(),
                               test_labels=Untouchable())
    config = presets.test().replace(epochs=2)
    run = train_and_evaluate(config, data, tmp_path, callbacks=[NanGuard(), Checkpointer()])
    assert run.step == 8 and run.stop_reason is None
    # What ranked the checkpoint is the validation evaluation, and only that.
    metrics = load_checkpoint(tmp_path).metrics
    assert set(metrics) == {"epoch", *(f"validation_{name}" for name in
                                       ("reconstruction", "kl", "loss", "neg_elbo",
                                        "active_units"))}


def test_nan_guard_watches_the_validation_figures(tmp_path):
    class PoisonValidation(Callback):
        def on_eval_end(self, run, metrics):
            if run.epoch == 1:
                metrics["loss"] = float("nan")

    config = presets.test().replace(epochs=3)
    run = train_and_evaluate(config, synthetic_dataset(80), tmp_path,
                             callbacks=[PoisonValidation(), NanGuard(), Checkpointer()])
    assert run.exit_code == 3 and "non-finite validation loss" in run.stop_reason
    # Epoch 1's checkpoint (step 4) is kept; nothing of epoch 2 was saved.
    assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == [4]


def test_cvae_train_runs_with_no_test_files_at_all(tmp_path):
    """The command itself never opens the test files: they may be missing."""
    data = write_synthetic_idx(tmp_path / "data", num_train=96, num_test=8)
    for name in (TEST_IMAGES, TEST_LABELS):
        (raw_dir_of(tmp_path / "data", "mnist") / name).unlink()
    result = subprocess.run(
        [sys.executable, "-m", "cvae.cli", "train", "--preset", "test", "--data-dir",
         str(tmp_path / "data"), "--checkpoint-dir", str(tmp_path / "ck"), "--no-progress"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert load_checkpoint(tmp_path / "ck").step == (len(data.train_images) - 16) // 16
    assert "validation loss" in result.stdout
