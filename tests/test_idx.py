"""cvae.data.idx: IDX files written and read back exactly; damaged files named with their
problem."""

import gzip

import numpy as np
import pytest
from idx_files import assert_one_line_error

from cvae.errors import DataError
from cvae.data.idx import read_idx, write_idx

# --- IDX read / write ---------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("shape", [(5, 28, 28), (7,), (2, 3, 4, 5)])
def test_write_then_read_idx_round_trips_exactly(tmp_path, suffix, shape):
    array = np.random.default_rng(1).integers(0, 256, size=shape, dtype=np.uint8)
    path = tmp_path / f"x-idx{suffix}"
    write_idx(path, array)
    back = read_idx(path)
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, array)
    if suffix:
        assert path.read_bytes()[:2] == b"\x1f\x8b"  # really gzip


def test_write_idx_writes_the_standard_header(tmp_path):
    write_idx(tmp_path / "labels", np.array([1, 2, 3], np.uint8))
    assert (tmp_path / "labels").read_bytes() == b"\x00\x00\x08\x01\x00\x00\x00\x03\x01\x02\x03"


def test_write_idx_gz_is_byte_identical_across_writes(tmp_path):
    array = np.arange(100, dtype=np.uint8)
    write_idx(tmp_path / "a.gz", array)
    write_idx(tmp_path / "b.gz", array)
    assert (tmp_path / "a.gz").read_bytes() == (tmp_path / "b.gz").read_bytes()


def test_write_idx_casts_integer_labels_in_range(tmp_path):
    write_idx(tmp_path / "labels", np.array([0, 9, 255], np.int64))
    np.testing.assert_array_equal(read_idx(tmp_path / "labels"), [0, 9, 255])


@pytest.mark.parametrize(
    "array", [np.array([0, 256]), np.array([-1, 3]), np.array([0.5, 1.0], np.float32)]
)
def test_write_idx_rejects_values_that_are_not_uint8(tmp_path, array):
    with pytest.raises(ValueError):
        write_idx(tmp_path / "bad", array)
    assert not list(tmp_path.iterdir())


def test_write_idx_leaves_no_temporary_files(tmp_path):
    write_idx(tmp_path / "deep" / "dir" / "x", np.zeros((2, 28, 28), np.uint8))
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
        read_idx(path)
    assert_one_line_error(excinfo, path, problem)


def test_read_idx_missing_file(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    with pytest.raises(DataError) as excinfo:
        read_idx(path)
    assert_one_line_error(excinfo, path, "file not found")


def test_read_idx_corrupt_gzip(tmp_path):
    path = tmp_path / "labels.gz"
    path.write_bytes(gzip.compress(GOOD)[:-10])
    with pytest.raises(DataError) as excinfo:
        read_idx(path)
    assert_one_line_error(excinfo, path, "gzip")
