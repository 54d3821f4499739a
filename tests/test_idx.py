"""IDX files: gzipped and plain, and every way they can be wrong."""
import gzip
import os

import numpy as np
import pytest

from esync.data.datasets import load_dataset, load_idx_dataset
from esync.data.idx import find_idx_file, read_idx
from esync.errors import UserError
from tests.helpers import IDX_NAMES, idx_bytes, make_idx_dataset, write_idx


@pytest.mark.parametrize("gz", [True, False])
def test_reads_images_and_labels(tmp_path, gz):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    labels = np.array([7, 1], dtype=np.uint8)
    ipath = write_idx(str(tmp_path / "img"), images, gz)
    lpath = write_idx(str(tmp_path / "lab"), labels, gz)
    assert np.array_equal(read_idx(ipath, 3), images)
    assert np.array_equal(read_idx(lpath, 1), labels)


def test_wrong_magic_names_file_and_expectation(tmp_path):
    path = write_idx(str(tmp_path / "img"), np.zeros((2, 4, 4)), magic=b"\x00\x00\x0d\x03")
    with pytest.raises(UserError, match=r"img\.gz has magic number 0x00000d03, expected 0x00000803"):
        read_idx(path, 3)


def test_labels_file_given_as_images_is_rejected(tmp_path):
    path = write_idx(str(tmp_path / "lab"), np.zeros(5))
    with pytest.raises(UserError, match="expected 0x00000803"):
        read_idx(path, 3)


def test_truncated_data(tmp_path):
    data = idx_bytes(np.ones((10, 28, 28)))[:-100]
    path = tmp_path / "img"
    path.write_bytes(data)
    with pytest.raises(UserError, match=r"img is truncated: header says shape 10x28x28 "
                                        r"\(7840 data bytes\), found 7740"):
        read_idx(str(path), 3)


def test_truncated_header_and_empty_file(tmp_path):
    (tmp_path / "a").write_bytes(b"\x00\x00\x08\x03\x00\x00")
    (tmp_path / "b").write_bytes(b"")
    with pytest.raises(UserError, match="truncated inside its header"):
        read_idx(str(tmp_path / "a"), 3)
    with pytest.raises(UserError, match="truncated: 0 bytes"):
        read_idx(str(tmp_path / "b"), 3)


def test_extra_bytes(tmp_path):
    (tmp_path / "lab").write_bytes(idx_bytes(np.ones(4)) + b"xx")
    with pytest.raises(UserError, match="longer than its header says"):
        read_idx(str(tmp_path / "lab"), 1)


def test_broken_gzip(tmp_path):
    good = gzip.compress(idx_bytes(np.ones((3, 4, 4))))
    (tmp_path / "img.gz").write_bytes(good[: len(good) // 2])
    with pytest.raises(UserError, match=r"img\.gz is not a valid gzip file"):
        read_idx(str(tmp_path / "img.gz"), 3)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(UserError, match=r"missing .*train-images-idx3-ubyte\.gz"):
        find_idx_file(str(tmp_path), "train-images-idx3-ubyte")


def test_plain_file_found_when_no_gz(tmp_path):
    path = tmp_path / "train-labels-idx1-ubyte"
    path.write_bytes(idx_bytes(np.ones(3)))
    assert find_idx_file(str(tmp_path), "train-labels-idx1-ubyte") == str(path)


def test_dataset_from_idx_folder(tmp_path):
    make_idx_dataset(str(tmp_path), "mnist", n_train=50, n_test=20, gz=False)
    data = load_dataset("mnist", str(tmp_path))
    assert data.train_images.shape == (50, 1, 28, 28) and data.test_labels.shape == (20,)
    assert data.train_labels.max() <= 9


def test_count_mismatch_names_both_files(tmp_path):
    folder = make_idx_dataset(str(tmp_path), n_train=50)
    write_idx(os.path.join(folder, IDX_NAMES["train_labels"]), np.zeros(49))
    with pytest.raises(UserError, match=r"train-images-idx3-ubyte\.gz holds 50 images but "
                                        r".*train-labels-idx1-ubyte\.gz holds 49 labels"):
        load_idx_dataset("fashion-mnist", str(tmp_path))


def test_label_out_of_range(tmp_path):
    folder = make_idx_dataset(str(tmp_path), n_test=20)
    write_idx(os.path.join(folder, IDX_NAMES["test_labels"]), np.full(20, 12))
    with pytest.raises(UserError, match="has label 12, expected labels 0..9"):
        load_idx_dataset("fashion-mnist", str(tmp_path))


def test_missing_folder_names_the_flag(tmp_path):
    with pytest.raises(UserError, match=r"-dd/--data-dir: no folder .*fashion-mnist"):
        load_dataset("fashion-mnist", str(tmp_path))


def test_digits_is_embedded_and_fixed():
    a, b = load_dataset("digits", "unused"), load_dataset("digits", "unused")
    assert a.train_images.shape == (1438, 1, 28, 28) and a.test_images.shape == (359, 1, 28, 28)
    assert a.train_images.dtype.is_floating_point is False
    assert set(a.train_labels.tolist()) == set(range(10))
    assert (a.test_labels == b.test_labels).all() and (a.train_images == b.train_images).all()
    x = a.normalize(a.train_images)
    assert abs(x.mean().item()) < 1e-3 and abs(x.std().item() - 1) < 1e-3
