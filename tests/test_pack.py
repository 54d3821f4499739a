"""esync-pack: every source packed and read back sample by sample, byte for byte, with
ShardSet and with the webdataset library; orders; --index on shards of other tools; and
every bad input as one line, exit 2."""
import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from PIL import Image

from esync.data.datasets import load_dataset
from esync.data.decode import ShardDataset
from esync.data.formats import CIFAR_CLASSES, image_folder
from esync.data.idx import read_idx
from esync.data.pack import main, pack, pack_arrays, pack_text, parse_size
from esync.data.shards import ShardSet
from esync.errors import UserError
from tests.helpers import IDX_NAMES, make_idx_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_pack(*args):
    """The real command, in a process of its own."""
    return subprocess.run([sys.executable, "-m", "esync.data.pack", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def one_line_error(capsys, argv, *fragments):
    """main(argv) exits 2 with one line `esync-pack: error: ...` holding `fragments`."""
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("esync-pack: error: "), err
    for fragment in fragments:
        assert str(fragment) in err, err
    return err


def read_all(out, split):
    """Every sample of a split, read shard by shard (one read each) and one by one."""
    shards = ShardSet(str(out), split)
    samples = []
    for first, end in zip(shards.starts[:-1], shards.starts[1:]):
        samples += shards.read(int(first), int(end - first))
    assert [s for i in range(len(shards)) for s in shards.read(i, 1)] == samples
    return shards, samples


def labels_of(samples):
    return [int(parts["cls"]) for _, parts in samples]


def pixels(data):
    with Image.open(io.BytesIO(data)) as image:
        return image.mode, np.array(image)


def write_images(folder, counts, ext="png", size=8):
    """Images {class: count} under folder/<class>/, each with its own pixels."""
    for c, (name, n) in enumerate(counts.items()):
        os.makedirs(folder / name, exist_ok=True)
        for i in range(n):
            rgb = np.full((size, size, 3), (c * 40, i * 7 % 256, 99), np.uint8)
            Image.fromarray(rgb).save(folder / name / f"{i:03d}.{ext}")


# --- sources, read back -----------------------------------------------------------------

def test_image_folder_round_trip_with_shards_split_at_the_size(tmp_path):
    src, out = tmp_path / "images", tmp_path / "out"
    write_images(src, {"cat": 25, "dog": 12, "eel": 10}, size=16)
    done = run_pack(src, out, "--shard-size", "8KB", "--order", "stored")
    assert done.returncode == 0, done.stderr
    tars = [out / n for n in os.listdir(out) if n.endswith(".tar")]
    assert done.stdout == (f"packed 43 train and 4 test samples in {len(tars)} shards "
                           f"({sum(map(os.path.getsize, tars))} bytes): {out}\n")
    expected = image_folder(str(src))  # the layout and test split of --dataset folder
    index = json.loads((out / "index.json").read_text())
    for split, source in zip(("train", "test"), expected):
        shards, samples = read_all(out, split)
        assert shards.input == "png" and shards.target == "cls"
        assert shards.classes == ["cat", "dog", "eel"]
        assert len(samples) == len(source.samples)
        for (key, parts), (path, label) in zip(samples, source.samples):
            assert set(parts) == {"png", "cls"}
            assert parts["png"] == open(path, "rb").read()
            assert int(parts["cls"]) == label
        assert shards.labels.tolist() == source.targets == labels_of(samples)
        for entry in index["splits"][split][:-1]:  # a shard ends once it holds 8 KiB
            assert entry["offsets"][-2] < 8 << 10 <= entry["offsets"][-1]
    assert len(index["splits"]["train"]) > 3
    # --index over the packer's own shards finds the same index, the classes' names
    # from the index there, or numbers
    assert main(["--index", str(out)]) == 0
    assert json.loads((out / "index.json").read_text()) == index
    os.remove(out / "index.json")
    assert main(["--index", str(out)]) == 0
    assert json.loads((out / "index.json").read_text()) == {**index, "classes": ["0", "1", "2"]}


def test_webdataset_reads_the_same_samples(tmp_path):
    wds = pytest.importorskip("webdataset")
    src, out = tmp_path / "images", tmp_path / "out"
    write_images(src, {"a": 10, "b": 10}, ext="jpg")
    pack(str(src), str(out), shard_bytes=4 << 10, order="interleave")
    for split in ("train", "test"):
        shards, samples = read_all(out, split)
        urls = [f.path for f in shards.files]
        assert len(urls) > 1 or split == "test"
        theirs = [(s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")})
                  for s in wds.WebDataset(urls, shardshuffle=False)]
        assert theirs == samples


def test_train_val_layout_jpeg_is_jpg(tmp_path):
    src, out = tmp_path / "images", tmp_path / "out"
    write_images(src / "train", {"a": 2, "b": 3}, ext="JPEG")
    write_images(src / "train", {"b": 1}, ext="jpg")  # b/000.jpg sorts after b/000.JPEG
    write_images(src / "val", {"b": 1}, ext="jpeg")
    assert main([str(src), str(out), "--order", "interleave"]) == 0
    shards, samples = read_all(out, "train")
    assert shards.input == "jpg" and shards.classes == ["a", "b"]
    files = ["a/000.JPEG", "b/000.JPEG", "a/001.JPEG", "b/000.jpg", "b/001.JPEG", "b/002.JPEG"]
    assert [p["jpg"] for _, p in samples] == [(src / "train" / f).read_bytes() for f in files]
    assert labels_of(samples) == [0, 1, 0, 1, 1, 1]
    _, samples = read_all(out, "test")
    assert samples == [("000000000", {"jpg": (src / "val/b/000.jpeg").read_bytes(),
                                      "cls": b"1"})]


def test_train_test_layout_of_npy_arrays(tmp_path):
    src, out = tmp_path / "arrays", tmp_path / "out"
    files = {}
    for split, counts in (("train", {"x": 3, "y": 2}), ("val", {"y": 2})):
        for name, n in counts.items():
            os.makedirs(src / split / name / "deeper")
            for i in range(n):
                path = src / split / name / "deeper" / f"{i}.npy"
                np.save(path, np.arange(i + 3, dtype=np.float32) * (len(name) + i))
                files.setdefault(split, []).append((path.read_bytes(), ["x", "y"].index(name)))
    (src / "train" / "x" / "notes.txt").write_text("not a sample")
    assert main([str(src), str(out), "--order", "stored"]) == 0
    for split, source in (("train", "train"), ("test", "val")):
        shards, samples = read_all(out, split)
        assert shards.input == "npy" and shards.classes == ["x", "y"]
        assert [(p["npy"], int(p["cls"])) for _, p in samples] == files[source]
        assert shards.labels.tolist() == [label for _, label in files[source]]


@pytest.mark.parametrize("gz", [True, False])
def test_idx_files_as_png(tmp_path, gz):
    folder = make_idx_dataset(str(tmp_path), "mine", n_train=40, n_test=15, gz=gz)
    out = tmp_path / "out"
    assert main([folder, str(out), "--shard-size", "16KB", "--order", "stored"]) == 0
    for split, prefix in (("train", "train"), ("test", "test")):
        images = read_idx(os.path.join(folder, IDX_NAMES[f"{prefix}_images"] + ".gz" * gz), 3)
        labels = read_idx(os.path.join(folder, IDX_NAMES[f"{prefix}_labels"] + ".gz" * gz), 1)
        shards, samples = read_all(out, split)
        assert len(samples) == len(labels) and shards.classes == [str(k) for k in range(10)]
        for (_, parts), image in zip(samples, images):
            mode, gray = pixels(parts["png"])
            assert mode == "L" and np.array_equal(gray, image)
        assert labels_of(samples) == shards.labels.tolist() == labels.tolist()


def test_cifar_batches_as_rgb_png(tmp_path):
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    rng = np.random.default_rng(1)
    records = {}
    for name, n in (("data_batch_1.bin", 7), ("data_batch_2.bin", 5), ("test_batch.bin", 4)):
        records[name] = rng.integers(0, 256, (n, 3073), dtype=np.uint8)
        records[name][:, 0] %= 10
        records[name].tofile(folder / name)
    out = tmp_path / "out"
    assert main([str(tmp_path), str(out), "--order", "shuffle", "--seed", "3"]) == 0
    for split, names in (("train", ["data_batch_1.bin", "data_batch_2.bin"]),
                         ("test", ["test_batch.bin"])):
        rows = np.concatenate([records[n] for n in names])
        shards, samples = read_all(out, split)
        assert shards.classes == CIFAR_CLASSES
        got = []
        for _, parts in samples:
            mode, rgb = pixels(parts["png"])
            assert mode == "RGB" and rgb.shape == (32, 32, 3)
            got.append(np.concatenate([[int(parts["cls"])], rgb.transpose(2, 0, 1).ravel()]))
        # shuffled: the same records, in another order
        got, rows = [list(map(bytes, np.asarray(a, np.uint8))) for a in (got, rows)]
        assert sorted(got) == sorted(rows) and (got != rows or split == "test")
        assert shards.labels.tolist() == labels_of(samples)


def test_digits_built_in(tmp_path):
    out = tmp_path / "out"
    assert main(["digits", str(out), "--order", "stored"]) == 0
    data = load_dataset("digits", "unused")
    for split in ("train", "test"):
        images = getattr(data, f"{split}_images").numpy()[:, 0]
        shards, samples = read_all(out, split)
        assert len(samples) == len(images)
        for (_, parts), image in zip(samples, images):
            assert np.array_equal(pixels(parts["png"])[1], image)
        assert labels_of(samples) == getattr(data, f"{split}_labels").tolist()
    # what --dataset shards: trains on
    image, label = ShardDataset(str(out), "test")[3]
    assert image.shape == (1, 28, 28) and label == data.test_labels[3]


def test_mnist_from_the_data_dir(tmp_path):
    make_idx_dataset(str(tmp_path), "mnist", n_train=12, n_test=3, gz=False)
    out = tmp_path / "out"
    assert main(["mnist", str(out), "--data-dir", str(tmp_path), "--order", "stored"]) == 0
    data = load_dataset("mnist", str(tmp_path))
    for split in ("train", "test"):
        _, samples = read_all(out, split)
        assert [pixels(p["png"])[1].tolist() for _, p in samples] == \
            getattr(data, f"{split}_images")[:, 0].tolist()
        assert labels_of(samples) == getattr(data, f"{split}_labels").tolist()


def test_text_windows(tmp_path):
    corpus = bytes(np.random.default_rng(2).integers(0, 256, 1000, dtype=np.uint8))
    (tmp_path / "corpus.txt").write_bytes(corpus)
    out = tmp_path / "out"
    done = run_pack(tmp_path / "corpus.txt", out, "--window", "16", "--shard-size", "2KB", "--order", "stored")
    assert done.returncode == 0, done.stderr
    windows = [corpus[i * 16:i * 16 + 17] for i in range(999 // 16)]  # 62 windows
    assert "packed 56 train and 6 test samples" in done.stdout
    for split, expected in (("train", windows[:56]), ("test", windows[56:])):
        shards, samples = read_all(out, split)
        assert shards.input == "npy" and shards.target is None and shards.labels is None
        assert len(shards.files) > 1 or split == "test"
        got = [np.load(io.BytesIO(p["npy"]), allow_pickle=False) for _, p in samples]
        assert all(g.dtype == np.uint8 and g.shape == (17,) for g in got)
        assert [g.tobytes() for g in got] == expected
    inputs, targets = ShardDataset(str(out), "test")[0]
    assert inputs.tolist() == list(windows[56][:-1]) and targets.tolist() == list(windows[56][1:])


def test_text_folder_sorted_without_hidden_files_and_shuffled(tmp_path):
    src = tmp_path / "books"
    (src / "b").mkdir(parents=True)
    (src / ".git").mkdir()
    (src / "b" / "2.txt").write_bytes(b"second part. ")
    (src / "a.txt").write_bytes(b"first part. ")
    (src / ".hidden").write_bytes(b"HIDDEN")
    (src / ".git" / "x").write_bytes(b"GIT")
    corpus = b"first part. second part. "
    outs = {}
    for name, seed in (("one", 5), ("two", 5), ("three", 6)):
        pack(str(src), str(tmp_path / name), "text", window=2, order="shuffle", seed=seed)
        outs[name] = [p["npy"] for _, p in read_all(tmp_path / name, "train")[1]]
    windows = [corpus[i * 2:i * 2 + 3] for i in range(len(corpus) // 2)]
    unpacked = lambda got: [np.load(io.BytesIO(b), allow_pickle=False).tobytes() for b in got]
    assert sorted(unpacked(outs["one"])) == sorted(windows[:-1])
    assert outs["one"] == outs["two"] != outs["three"]
    assert unpacked(outs["one"]) != windows[:-1]


# --- orders -----------------------------------------------------------------------------

def test_interleave_deals_the_classes_round_robin(tmp_path):
    train = np.arange(9 * 4, dtype=np.uint8).reshape(9, 2, 2)
    labels = np.array([0, 0, 0, 0, 0, 1, 1, 1, 2])  # stored class by class
    out = tmp_path / "out"
    pack_arrays(str(out), train, labels, train[:3], labels[[8, 0, 5]], shard_bytes=3000,
                order="interleave")
    shards, samples = read_all(out, "train")
    assert labels_of(samples) == [0, 1, 2, 0, 1, 0, 1, 0, 0]
    sources = [0, 5, 8, 1, 6, 2, 7, 3, 4]
    assert [pixels(p["png"])[1].tolist() for _, p in samples] == train[sources].tolist()
    assert labels_of(read_all(out, "test")[1]) == [0, 1, 2]
    assert len(shards.files) > 1


# --- --index on shards written by other tools --------------------------------------------

def write_tar(path, members):
    with tarfile.open(path, "w") as tar:  # tarfile's default (GNU) format, with a folder
        folder = tarfile.TarInfo("data")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_index_of_shards_written_with_tarfile(tmp_path):
    rng = np.random.default_rng(4)
    source = {}
    shards = {"train-a.tar": range(0, 5), "train-b.tar": range(5, 8), "val.tar": range(8, 10)}
    for name, keys in shards.items():
        members = []
        for k in keys:
            parts = {"jpg": bytes(rng.integers(0, 256, 700 + k, dtype=np.uint8)),
                     "json": b'{"k": %d}' % k, "cls": b"%d\n" % (k % 3)}
            if k == 6:
                parts["png"] = b"extra"  # jpg is every sample's; png only this one's
            source[f"data/{k:04d}"] = parts
            members += [(f"data/{k:04d}.{ext}", data) for ext, data in parts.items()]
        write_tar(tmp_path / name, members)
    (tmp_path / "other.tar").write_bytes(b"not read: neither train nor test")
    assert main(["--index", str(tmp_path)]) == 0
    for split, keys in (("train", range(8)), ("test", range(8, 10))):
        shards, samples = read_all(tmp_path, split)
        assert shards.input == "jpg" and shards.target == "cls"
        assert shards.classes == ["0", "1", "2"]
        assert samples == [(f"data/{k:04d}", source[f"data/{k:04d}"]) for k in keys]
        assert shards.labels.tolist() == [k % 3 for k in keys]
    wds = pytest.importorskip("webdataset")
    urls = [str(tmp_path / n) for n in ("train-a.tar", "train-b.tar")]
    assert [s["__key__"] for s in wds.WebDataset(urls, shardshuffle=False)] == \
        [f"data/{k:04d}" for k in range(8)]


def test_index_without_labels_and_of_webdataset_s_writer(tmp_path):
    wds = pytest.importorskip("webdataset")
    arrays = [np.full((2, 3), k, np.int16) for k in range(6)]
    for name, ks in (("train-0.tar", range(4)), ("test-0.tar", range(4, 6))):
        with wds.TarWriter(str(tmp_path / name)) as sink:
            for k in ks:
                sink.write({"__key__": f"s{k}", "npy": arrays[k], "txt": f"#{k}"})
    assert main(["--index", str(tmp_path)]) == 0
    shards, samples = read_all(tmp_path, "train")
    assert shards.input == "npy" and shards.target is None and shards.labels is None
    assert [k for k, _ in samples] == ["s0", "s1", "s2", "s3"]
    assert all(np.array_equal(np.load(io.BytesIO(p["npy"])), arrays[i])
               for i, (_, p) in enumerate(samples))


def test_index_errors_name_the_file(tmp_path, capsys):
    write_tar(tmp_path / "train-0.tar", [("1.png", b"a"), ("1.cls", b"0"),
                                         ("2.txt", b"b"), ("2.cls", b"1")])
    one_line_error(capsys, ["--index", tmp_path], "train-0.tar", "sample 2 has no .png part")
    write_tar(tmp_path / "train-0.tar", [("1.png", b"a"), ("1.cls", b"zero")])
    one_line_error(capsys, ["--index", tmp_path], "train-0.tar", "'zero'", "not a class number")
    write_tar(tmp_path / "train-0.tar", [("1.png", b"a" * 2000), ("2.png", b"b" * 2000)])
    data = (tmp_path / "train-0.tar").read_bytes()
    (tmp_path / "train-0.tar").write_bytes(data[:1800])  # cut inside the first member
    one_line_error(capsys, ["--index", tmp_path], "train-0.tar", "cut short")
    # a folder's header, then 1.png's header at 512 and data at 1024, 2.png's header at 3072
    (tmp_path / "train-0.tar").write_bytes(data[:3072] + b"garbage!" * 64 + data[3584:])
    one_line_error(capsys, ["--index", tmp_path], "train-0.tar", "not a readable tar file",
                   "no tar header at byte 3072")
    (tmp_path / "train-0.tar").write_bytes(b"\x01" * 1024)
    one_line_error(capsys, ["--index", tmp_path], "train-0.tar", "not a readable tar file")
    os.remove(tmp_path / "train-0.tar")
    write_tar(tmp_path / "test-0.tar", [("1.png", b"a")])
    one_line_error(capsys, ["--index", tmp_path], str(tmp_path), "no train*.tar shards",
                   "test-0.tar")
    assert not (tmp_path / "index.json").exists()


# --- bad input --------------------------------------------------------------------------

def test_shard_sizes():
    assert parse_size("64MB") == 64 << 20 and parse_size("500KB") == 500 << 10
    assert parse_size("1GB") == 1 << 30 and parse_size("1234") == 1234
    assert parse_size("1.5kib") == 1536 and parse_size("2 M") == 2 << 20
    for bad in ("64XB", "0", "-1", "MB", "", "1.5.5KB", "64ib"):
        with pytest.raises(UserError, match=r"--shard-size .*: expected a positive number"):
            parse_size(bad)


def test_bad_sources_are_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    (tmp_path / "empty").mkdir()
    one_line_error(capsys, [tmp_path / "empty", out], "empty: cannot tell what it holds")
    one_line_error(capsys, [tmp_path / "empty", out, "--format", "folder"],
                   "empty has no class folders")
    write_images(tmp_path / "img", {"a": 10, "b": 0})
    one_line_error(capsys, [tmp_path / "img", out], os.path.join(tmp_path, "img", "b"),
                   "holds no images")
    write_images(tmp_path / "img", {"a": 10, "b": 10, "c": 1}, ext="jpg")
    one_line_error(capsys, [tmp_path / "img", out], "mixes .jpg and .png",
                   os.path.join(tmp_path, "img", "a", "000.jpg"),
                   os.path.join(tmp_path, "img", "a", "000.png"))
    one_line_error(capsys, [tmp_path / "nowhere", out], "nowhere: no such file or folder")
    one_line_error(capsys, [tmp_path / "img", out, "--shard-size", "lots"], "--shard-size lots")
    one_line_error(capsys, [tmp_path / "img", out, "--order", "random"], "--order", "random")
    (tmp_path / "tiny.txt").write_bytes(b"0123456789")
    one_line_error(capsys, [tmp_path / "tiny.txt", out, "--window", "8"],
                   "tiny.txt is 10 bytes: too short")
    one_line_error(capsys, [tmp_path / "tiny.txt", out, "--window", "2", "--order",
                            "interleave"], "--order interleave", "no classes")
    one_line_error(capsys, [tmp_path / "tiny.txt"], "expected SRC and OUT")
    one_line_error(capsys, ["mnist", out, "--data-dir", tmp_path], "no folder",
                   os.path.join(tmp_path, "mnist"))
    assert not out.exists() or not os.listdir(out)


def test_out_is_refused_unless_force_and_a_failed_pack_leaves_nothing(tmp_path, capsys):
    src, out = tmp_path / "img", tmp_path / "out"
    write_images(src, {"a": 10, "b": 10})
    assert main([str(src), str(out), "--shard-size", "1KB"]) == 0
    many = sorted(os.listdir(out))
    one_line_error(capsys, [src, out], f"{out} already holds index.json and more", "--force")
    assert main([str(src), str(out), "--force"]) == 0  # fewer shards: the old ones go
    assert sorted(os.listdir(out)) == ["index.json", "test-000000.tar", "train-000000.tar"]
    assert len(many) > 3
    os.remove(src / "b" / "005.png")
    os.symlink(tmp_path / "gone.png", src / "b" / "005.png")  # unreadable, late in the order
    one_line_error(capsys, [src, out, "--force"], "cannot read", "005.png")
    assert os.listdir(out) == []


def test_command_exit_status_and_one_line_on_stderr(tmp_path):
    done = run_pack(tmp_path / "missing", tmp_path / "out")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"esync-pack: error: {tmp_path / 'missing'}: no such file or " \
                          f"folder (or built-in data set: digits, mnist, fashion-mnist)\n"
    done = run_pack("--no-such-flag")
    assert (done.returncode, done.stderr) == (
        2, "esync-pack: error: unrecognized arguments: --no-such-flag\n")


# --- what ShardSet makes of damaged shards and indexes ----------------------------------

@pytest.fixture
def packed(tmp_path):
    out = tmp_path / "out"
    pack_text(str(out), bytes(range(256)) * 8, window=16, shard_bytes=2048)
    return out


def test_truncated_shard_names_the_file(packed):
    path = packed / "train-000001.tar"
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(UserError, match=rf"shard {path} is \d+ bytes, the index says "
                                        rf"{len(data)}: truncated") as e:
        ShardSet(str(packed), "train")
    assert "\n" not in str(e.value)


def test_corrupt_offsets_name_the_shard(packed):
    index = json.loads((packed / "index.json").read_text())
    index["splits"]["train"][0]["offsets"][1] += 512  # inside the first sample's data
    (packed / "index.json").write_text(json.dumps(index))
    shards = ShardSet(str(packed), "train")
    with pytest.raises(UserError, match=rf"shard {packed / 'train-000000.tar'} is corrupt "
                                        rf"at bytes 1536\.\.2048"):
        shards.read(1, 1)


def test_corrupt_and_missing_index_name_the_file(packed):
    index = packed / "index.json"
    index.write_text('{"format": "esync-shards", "version": 1, "splits": {')
    with pytest.raises(UserError, match=rf"{index}: not a readable JSON index"):
        ShardSet(str(packed), "train")
    os.remove(index)
    with pytest.raises(UserError, match=rf"{index}: no index of the shards"):
        ShardSet(str(packed), "test")


def test_label_out_of_range_in_the_index_names_the_file(tmp_path):
    out = tmp_path / "out"
    pack_arrays(str(out), np.zeros((4, 2, 2)), [0, 1, 2, 1], np.zeros((1, 2, 2)), [2])
    index = json.loads((out / "index.json").read_text())
    index["splits"]["train"][0]["labels"][3] = 7
    (out / "index.json").write_text(json.dumps(index))
    with pytest.raises(UserError, match=rf"{out / 'index.json'}: shard train-000000.tar's "
                                        rf"sample 3 has label 7, outside the 3 classes") as e:
        ShardSet(str(out), "train")
    assert "\n" not in str(e.value)
