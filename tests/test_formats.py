"""Image folders and CIFAR-10's binary files: layouts, splits, normalisation, and errors."""
import os

import numpy as np
import pytest
import torch
from PIL import Image

from esync.data.formats import CIFAR_CLASSES, cifar10_binary, image_folder
from esync.errors import UserError


def write_images(folder, classes, n, width=32, height=32, ext="png"):
    """`n` images per class under folder/<class>/, pixel values telling class and number."""
    for c, name in enumerate(classes):
        os.makedirs(folder / name, exist_ok=True)
        for i in range(n):
            pixels = np.full((height, width, 3), (c * 60, i * 20, 255), np.uint8)
            Image.fromarray(pixels).save(folder / name / f"{i:03d}.{ext}")


def write_cifar(folder, labels_per_file, meta=None):
    """One CIFAR binary file per {name: labels}; image j of a file is filled with j."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, labels in labels_per_file.items():
        records = np.zeros((len(labels), 3073), np.uint8)
        records[:, 0] = labels
        records[:, 1:] = np.arange(len(labels))[:, None]
        records.tofile(folder / name)
    if meta is not None:
        (folder / "batches.meta.txt").write_text("\n".join(meta) + "\n\n")


# image folders

def test_train_test_layout(tmp_path):
    write_images(tmp_path / "train", ["cat", "dog", "eel"], 12)
    write_images(tmp_path / "test", ["cat", "eel"], 2)
    train, test = image_folder(str(tmp_path))
    assert train.classes == test.classes == ["cat", "dog", "eel"]
    assert len(train) == 36 and train.targets == [0] * 12 + [1] * 12 + [2] * 12
    assert test.targets == [0, 0, 2, 2]
    image, label = test[3]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and label == 2
    # test/eel/001.png: red 60 (second folder written), green 20, blue 255 -> (x/255 - 0.5)/0.5
    expected = torch.tensor([60, 20, 255]) / 255.0 * 2 - 1
    assert torch.allclose(image[:, 5, 5], expected)
    assert image.min() >= -1 and image.max() <= 1


def test_val_in_place_of_test(tmp_path):
    write_images(tmp_path / "train", ["a", "b"], 3)
    write_images(tmp_path / "val", ["b"], 1)
    train, test = image_folder(str(tmp_path))
    assert len(train) == 6 and test.targets == [1]


def test_single_folder_split_every_tenth_file(tmp_path):
    write_images(tmp_path, ["cat", "dog", "eel"], 12)
    write_images(tmp_path, ["fox"], 21, ext="jpg")
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    (tmp_path / ".ipynb_checkpoints").mkdir()  # hidden folders are no classes
    train, test = image_folder(str(tmp_path))
    assert train.classes == test.classes == ["cat", "dog", "eel", "fox"]
    assert len(train) == 3 * 11 + 19 and len(test) == 3 + 2
    assert [os.path.basename(p) for p, _ in test.samples] == \
        ["009.png"] * 3 + ["009.jpg", "019.jpg"]
    assert test.targets == [0, 1, 2, 3, 3]
    assert not {p for p, _ in train.samples} & {p for p, _ in test.samples}
    again, _ = image_folder(str(tmp_path))
    assert again.samples == train.samples


def test_size_resizes_every_image(tmp_path):
    write_images(tmp_path / "train", ["x", "y"], 2, width=20, height=24)
    write_images(tmp_path / "test", ["x", "y"], 1, width=40, height=10)
    train, test = image_folder(str(tmp_path), size=16)
    assert train[0][0].shape == test[1][0].shape == (3, 16, 16)
    write_images(tmp_path / "one", ["x", "y"], 10, width=20, height=24)
    train, test = image_folder(str(tmp_path / "one"))
    assert train[0][0].shape == test[1][0].shape == (3, 24, 20)


def test_mixed_sizes_without_size(tmp_path):
    write_images(tmp_path / "train", ["x"], 1, width=20, height=24)
    write_images(tmp_path / "test", ["x"], 1, width=40, height=10)
    _, test = image_folder(str(tmp_path))
    with pytest.raises(UserError, match=r"000\.png is 40x10 pixels, other images 20x24: "
                                        r"give a size"):
        test[0]


def test_grey_image_becomes_rgb_and_broken_image_is_named(tmp_path):
    write_images(tmp_path / "train", ["x"], 1)
    os.makedirs(tmp_path / "test" / "x")
    Image.fromarray(np.zeros((32, 32), np.uint8)).save(tmp_path / "test" / "x" / "grey.png")
    (tmp_path / "test" / "x" / "broken.png").write_bytes(b"not a png")
    _, test = image_folder(str(tmp_path))
    assert test[1][0].shape == (3, 32, 32)
    with pytest.raises(UserError, match=r"cannot read image .*broken\.png"):
        test[0]


def test_image_folder_errors(tmp_path):
    with pytest.raises(UserError, match=r"no image folder .*nowhere"):
        image_folder(str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match=r"has no class folders"):
        image_folder(str(tmp_path))
    with pytest.raises(UserError, match=r"image size 0 for .*expected a positive number"):
        image_folder(str(tmp_path), size=0)
    (tmp_path / "a").mkdir()
    with pytest.raises(UserError, match=r"a holds no images \(\.jpg, "):
        image_folder(str(tmp_path))
    write_images(tmp_path, ["a"], 9)
    with pytest.raises(UserError, match=r"has no test split: .* no class has the 10 images"):
        image_folder(str(tmp_path))


def test_split_layout_errors(tmp_path):
    write_images(tmp_path / "test", ["a"], 1)
    with pytest.raises(UserError, match=r"has test/ but no train/ split"):
        image_folder(str(tmp_path))
    write_images(tmp_path / "train", ["a", "b"], 1)
    write_images(tmp_path / "test", ["c", "d"], 1)
    with pytest.raises(UserError, match=r"test has class folders c, d that .*train lacks"):
        image_folder(str(tmp_path))
    other = tmp_path / "other"
    write_images(other / "train", ["a"], 1)
    with pytest.raises(UserError, match=r"other has train/ but no test split"):
        image_folder(str(other))


def test_batches_through_a_data_loader(tmp_path):
    write_images(tmp_path / "images", ["a", "b"], 10)
    write_cifar(tmp_path / "cifar", {"data_batch_1.bin": [3] * 5, "test_batch.bin": [4]})
    images_set, _ = image_folder(str(tmp_path / "images"))
    cifar_set, _ = cifar10_binary(str(tmp_path / "cifar"))
    for train in (images_set, cifar_set):
        images, labels = next(iter(torch.utils.data.DataLoader(train, batch_size=4)))
        assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
        assert labels.shape == (4,) and labels.dtype == torch.int64


# CIFAR-10, binary version

@pytest.mark.parametrize("parent", [True, False])
def test_cifar_binary(tmp_path, parent):
    folder = tmp_path / "cifar-10-batches-bin"
    rng = np.random.RandomState(0)
    files = {"data_batch_2.bin": rng.randint(0, 10, 20), "data_batch_1.bin": rng.randint(0, 10, 50),
             "test_batch.bin": rng.randint(0, 10, 20)}
    write_cifar(folder, files)
    train, test = cifar10_binary(str(tmp_path if parent else folder))
    assert len(train) == 70 and len(test) == 20
    assert train.classes == test.classes == CIFAR_CLASSES
    assert train.targets == list(files["data_batch_1.bin"]) + list(files["data_batch_2.bin"])
    image, label = train[51]  # second record of data_batch_2
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert label.dtype == torch.int64 and label == files["data_batch_2.bin"][1]
    assert torch.allclose(image, torch.full((3, 32, 32), 1 / 255 * 2 - 1))
    assert train[0][0].min() == -1


def test_cifar_pixels_are_channel_major(tmp_path):
    record = np.zeros(3073, np.uint8)
    record[1:] = np.repeat([0, 255, 51], 1024)  # red 0, green 255, blue 51
    (tmp_path / "data_batch_1.bin").write_bytes(record.tobytes())
    (tmp_path / "test_batch.bin").write_bytes(record.tobytes())
    train, _ = cifar10_binary(str(tmp_path))
    assert torch.allclose(train[0][0][:, 7, 9], torch.tensor([-1.0, 1.0, -0.6]))


def test_cifar_class_names_from_meta(tmp_path):
    write_cifar(tmp_path, {"data_batch_1.bin": [0, 1, 2], "test_batch.bin": [2]},
                meta=["ant", "bee", "cow"])
    train, test = cifar10_binary(str(tmp_path))
    assert train.classes == test.classes == ["ant", "bee", "cow"]
    assert test.targets == [2]


def test_cifar_errors(tmp_path):
    with pytest.raises(UserError, match=r"no CIFAR-10 folder .*nowhere"):
        cifar10_binary(str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match=r"has no data_batch_\*\.bin files"):
        cifar10_binary(str(tmp_path))
    write_cifar(tmp_path, {"data_batch_1.bin": [0, 1]})
    with pytest.raises(UserError, match=r"has no test_batch\.bin: no test split"):
        cifar10_binary(str(tmp_path))
    write_cifar(tmp_path, {"test_batch.bin": [1]}, meta=["ant", "bee"])
    (tmp_path / "data_batch_2.bin").write_bytes(bytes(3073 * 2 - 1))
    with pytest.raises(UserError, match=r"data_batch_2\.bin is 6145 bytes, not a whole number "
                                        r"of 3073-byte records"):
        cifar10_binary(str(tmp_path))
    (tmp_path / "data_batch_2.bin").write_bytes(b"")
    with pytest.raises(UserError, match=r"data_batch_2\.bin is 0 bytes"):
        cifar10_binary(str(tmp_path))
    write_cifar(tmp_path, {"data_batch_2.bin": [1, 0, 2]})
    with pytest.raises(UserError, match=r"data_batch_2\.bin: record 2 has label 2, but there "
                                        r"are only 2 class names"):
        cifar10_binary(str(tmp_path))
