"""cvae.data.load: loading the four IDX files (or torchvision's view of them) into a checked
Dataset."""

import sys
import types

import numpy as np
import pytest
from idx_files import assert_dataset_matches, assert_one_line_error, random_split, write_four

from cvae.data import load as data
from cvae.errors import DataError
from cvae.data.idx import IDX_FILES, write_idx

RAW_FILES = IDX_FILES


# --- load_dataset -------------------------------------------------------------------------------


def test_load_dataset_from_flat_directory_of_user_idx_files(tmp_path):
    arrays = write_four(tmp_path)
    assert_dataset_matches(data.load_dataset(tmp_path), arrays)


@pytest.mark.parametrize(
    "name, folder", [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")]
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
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(5, np.uint8))
    with pytest.raises(DataError) as excinfo:
        data.load_dataset(tmp_path)
    assert_one_line_error(excinfo, "train-labels-idx1-ubyte", "5 labels", "6 images")


def test_load_dataset_wrong_image_shape(tmp_path):
    write_four(tmp_path)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((4, 32, 32), np.uint8))
    with pytest.raises(DataError) as excinfo:
        data.load_dataset(tmp_path)
    assert_one_line_error(excinfo, "t10k-images-idx3-ubyte", "[N, 28, 28]", "(4, 32, 32)")


def test_load_dataset_labels_out_of_range(tmp_path):
    write_four(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([0, 1, 2, 12], np.uint8))
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
    [({"name": "cifar"}, "mnist, fashion_mnist"), ({"source": "hdf5"}, "idx, torchvision")],
)
def test_load_dataset_unknown_name_or_source_lists_allowed(tmp_path, kwargs, allowed):
    with pytest.raises(ValueError, match=allowed):
        data.load_dataset(tmp_path, **kwargs)


def test_torchvision_source_without_torch_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # makes `import torchvision` fail
    with pytest.raises(DataError, match=r"pip install -e '\.\[torch\]'"):
        data.load_dataset(tmp_path, source="torchvision")


def _fake_torchvision(arrays):
    """A stand-in torchvision.datasets whose FashionMNIST serves `arrays` like torchvision does."""

    class Tensor:
        def __init__(self, array):
            self.array = array

        def numpy(self):
            return self.array

    class FashionMNIST:
        def __init__(self, root, train, download):
            assert download is False
            images, labels = arrays[:2] if train else arrays[2:]
            self.data, self.targets = Tensor(images), Tensor(labels.astype(np.int64))

    datasets = types.SimpleNamespace(FashionMNIST=FashionMNIST)
    return types.SimpleNamespace(datasets=datasets)


def test_torchvision_source_reads_data_and_targets(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    arrays = [*random_split(rng, 5), *random_split(rng, 2)]
    fake = _fake_torchvision(arrays)
    monkeypatch.setitem(sys.modules, "torchvision", fake)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", fake.datasets)
    dataset = data.load_dataset(tmp_path, name="fashion_mnist", source="torchvision")
    assert_dataset_matches(dataset, arrays, name="fashion_mnist")


# --- the real torchvision (the `torch` extra; .ci/run installs it and runs these) -------------


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_real_torchvision_reads_the_same_bytes_as_the_idx_reader(tmp_path, name):
    # `make torch-cpu` (the bench's PyTorch baseline) installs torch alone: the extra is there
    # when torchvision is. `make test-torch` checks that it imports before running these.
    pytest.importorskip("torchvision", reason="the torch extra is not installed")

    arrays = write_four(data.raw_dir_of(tmp_path, name), train_n=12, test_n=5)
    through_torchvision = data.load_dataset(tmp_path, name=name, source="torchvision")
    assert_dataset_matches(through_torchvision, arrays, name=name)
    assert_dataset_matches(data.load_dataset(tmp_path, name=name, source="idx"), arrays,
                           name=name)


def test_real_torchvision_without_the_files_is_one_line_naming_the_folder(tmp_path):
    pytest.importorskip("torchvision", reason="the torch extra is not installed")

    with pytest.raises(DataError) as excinfo:
        data.load_dataset(tmp_path, source="torchvision")
    assert_one_line_error(excinfo, tmp_path / "MNIST" / "raw", "torchvision MNIST", "cvae data")
