"""`mlless prepare --format cifar | mnist | image-folder`: small files of each format written here, read back through
`Dataset` pixel for pixel and label for label, and every damaged file refused in one line naming it."""
from __future__ import annotations

import gzip
import os
import pickle
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from mlless.contract import EXIT_FAILED, EXIT_USAGE
from test_prepare_images import noise, prepare, read_back, rows_of

# --------------------------------------------------------------------------------------------------- CIFAR


def cifar_batch(path: Path, images: np.ndarray, labels: np.ndarray, protocol: int = pickle.DEFAULT_PROTOCOL) -> Path:
    """A batch as CIFAR's python version holds one: `data`, one row of 3 × side × side pixels an image."""
    with open(path, "wb") as fh:
        pickle.dump({"batch_label": "a batch", "labels": labels.tolist(), "data": images.reshape(len(images), -1),
                     "filenames": [f"{i}.png" for i in range(len(images))]}, fh, protocol=protocol)
    return path


def python2_batch(images: np.ndarray, labels: np.ndarray) -> bytes:
    """A CIFAR-100 batch as Python 2's cPickle wrote the originals (protocol 2): keys and the array's bytes are
    Python 2 strings, which Python 3 reads as bytes, and numpy's names are numpy.core's. Opcode by opcode."""
    def string(data: bytes) -> bytes:  # SHORT_BINSTRING or BINSTRING
        return b"U" + bytes([len(data)]) + data if len(data) < 256 else b"T" + struct.pack("<i", len(data)) + data

    def integer(n: int) -> bytes:  # BININT
        return b"J" + struct.pack("<i", n)

    data = images.reshape(len(images), -1)
    array = (b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n" + integer(0) + b"\x85" + string(b"b")
             + b"\x87R" + b"(" + integer(1) + integer(data.shape[0]) + integer(data.shape[1]) + b"\x86"
             + b"cnumpy\ndtype\n" + string(b"u1") + integer(0) + integer(1) + b"\x87R"
             + b"(" + integer(3) + string(b"|") + b"NNN" + integer(-1) + integer(-1) + integer(0) + b"tb"
             + b"\x89" + string(data.tobytes()) + b"tb")
    fine = b"](" + b"".join(integer(int(v)) for v in labels) + b"e"
    coarse = b"](" + b"".join(integer(int(v) // 5) for v in labels) + b"e"
    return (b"\x80\x02}(" + string(b"data") + array + string(b"fine_labels") + fine + string(b"coarse_labels")
            + coarse + b"u.")


def cifar_dir(root: Path, parts: dict[str, int], side: int = 32, classes: int = 10) -> dict[str, tuple]:
    """CIFAR-10-like batches of random images under `root`, by file name; what each holds."""
    root.mkdir(parents=True, exist_ok=True)
    held = {}
    for i, (name, rows) in enumerate(parts.items()):
        images = noise(rows, 3, side, side, seed=i)
        labels = np.random.default_rng(100 + i).integers(0, classes, rows)
        labels[:classes] = np.arange(classes)  # every class in every batch
        cifar_batch(root / name, images, labels)
        held[name] = (images, labels)
    return held


def tar_gz(folder: Path, into: Path) -> Path:
    with tarfile.open(into, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return into


def concat(held: dict[str, tuple], names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([held[n][0] for n in names]), np.concatenate([held[n][1] for n in names])


def test_a_cifar10_directory_reads_its_five_training_batches_pixel_for_pixel(tmp_path):
    names = [f"data_batch_{i}" for i in range(1, 6)]
    held = cifar_dir(tmp_path / "cifar-10-batches-py", {**{n: 24 for n in names}, "test_batch": 20})
    (tmp_path / "cifar-10-batches-py" / "batches.meta").write_bytes(pickle.dumps({"label_names": ["a"] * 10}))
    assert prepare("--format", "cifar", str(tmp_path / "cifar-10-batches-py"), "--out", str(tmp_path / "ds")) == 0
    ds, train_x, train_y, val_x, val_y = read_back(tmp_path / "ds")

    assert train_x.shape[1:] == (3, 32, 32) and ds.dims()["n_classes"] == 10
    assert len(train_x) + len(val_x) == 120  # the test batch is not read without --validation
    x, y = concat(held, names)
    assert rows_of(train_x, train_y) | rows_of(val_x, val_y) == rows_of(x, y)
    assert ds.manifest.feature_stats["label_values"] == list(range(10))
    np.testing.assert_allclose(ds.dims()["pixel_mean"], train_x.astype(np.float64).mean(axis=(0, 2, 3)), rtol=1e-12)


def test_the_distributed_archive_is_read_without_extracting_and_validates_on_its_test_batch(tmp_path, monkeypatch):
    folder = tmp_path / "cifar-10-batches-py"
    held = cifar_dir(folder, {"data_batch_2": 15, "data_batch_1": 15, "test_batch": 12})
    (folder / "readme.html").write_text("<p>not a batch</p>")
    archive = tar_gz(folder, tmp_path / "cifar-10-python.tar.gz")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # nothing is extracted here
    assert prepare("--format", "cifar", str(archive), "--validation", str(archive), "--out", str(tmp_path / "ds"),
                   "--batch-size", "8") == 0
    assert list(work.iterdir()) == []
    ds, train_x, train_y, val_x, val_y = read_back(tmp_path / "ds")

    x, y = concat(held, ["data_batch_1", "data_batch_2"])
    assert rows_of(train_x, train_y) == rows_of(x, y) and len(train_x) == 30
    # The test batch is the validation split, whole and in its order.
    np.testing.assert_array_equal(val_x, held["test_batch"][0])
    np.testing.assert_array_equal(val_y, held["test_batch"][1])
    assert ds.manifest.source == {"format": "cifar", "path": str(archive), "validation": str(archive),
                                  "labels": "classes"}


def test_cifar100_batches_as_python2_wrote_them_give_the_fine_labels(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    train, test = noise(40, 3, 32, 32, seed=1), noise(10, 3, 32, 32, seed=2)
    train_y, test_y = np.arange(40) % 20 * 5 + 3, np.arange(10) * 5 + 3  # 20 of the 100 fine classes
    (folder / "train").write_bytes(python2_batch(train, train_y))
    (folder / "test").write_bytes(python2_batch(test, test_y))
    assert prepare("--format", "cifar", str(folder), "--validation", str(folder), "--out", str(tmp_path / "ds")) == 0
    ds, got_x, got_y, val_x, val_y = read_back(tmp_path / "ds")

    values = sorted(set(train_y.tolist()))
    assert ds.manifest.feature_stats["label_values"] == values
    assert rows_of(got_x, got_y) == rows_of(train, [values.index(v) for v in train_y])
    np.testing.assert_array_equal(val_x, test)
    assert [values[c] for c in val_y] == test_y.tolist()


def test_one_batch_file_of_smaller_square_images_is_an_input(tmp_path):
    images, labels = noise(30, 3, 8, 8), np.arange(30) % 3
    src = cifar_batch(tmp_path / "data_batch_1", images, labels)
    test = cifar_batch(tmp_path / "mine", noise(6, 3, 8, 8, seed=9), np.arange(6) % 3, protocol=2)  # bytes as text
    assert prepare("--format", "cifar", str(src), "--validation", str(test), "--out", str(tmp_path / "ds")) == 0
    ds, train_x, train_y, val_x, _ = read_back(tmp_path / "ds")
    assert rows_of(train_x, train_y) == rows_of(images, labels) and train_x.shape[1:] == (3, 8, 8)
    assert len(val_x) == 6


class Shell:
    """Pickled, this runs a shell command when plain pickle loads it."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def cut(path: Path, keep: float = 0.6) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def cifar_cases(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Damaged CIFAR inputs, and what the error line says besides the file's name."""
    tmp_path.mkdir(exist_ok=True)
    marker = tmp_path / "ran"
    images, labels = noise(12, 3, 32, 32), np.arange(12) % 2
    hostile = tmp_path / "hostile"
    hostile.write_bytes(pickle.dumps({"data": Shell(f"touch {marker}"), "labels": [0, 1]}))
    floats = tmp_path / "floats"
    floats.write_bytes(pickle.dumps({"data": images.reshape(12, -1).astype(np.float32), "labels": labels.tolist()}))
    wide = tmp_path / "wide"
    wide.write_bytes(pickle.dumps({"data": images.reshape(12, -1).astype(np.int16), "labels": labels.tolist()}))
    no_labels = tmp_path / "no_labels"
    no_labels.write_bytes(pickle.dumps({"data": images.reshape(12, -1)}))
    cifar_dir(tmp_path / "c" / "cifar-10-batches-py", {"data_batch_1": 12})
    archive = tar_gz(tmp_path / "c" / "cifar-10-batches-py", tmp_path / "c.tar.gz")
    return {
        "truncated batch": (cut(cifar_batch(tmp_path / "data_batch_1", images, labels)), "not a readable CIFAR batch"),
        "a global": (hostile, "names posix.system"),
        "float pixels": (floats, "an array of float32: only integer arrays are read"),
        "int16 pixels": (wide, "'data' must be a uint8 array"),
        "no labels": (no_labels, "no 'data' and 'labels'"),
        "truncated archive": (cut(archive, 0.5), "not a readable tar archive"),
        "not a square": (cifar_batch(tmp_path / "odd", noise(4, 3, 4, 5), np.arange(4) % 2), "not 3 channels of a "),
    }


def test_the_restricted_unpickler_reads_plain_data_and_integer_arrays_alone():
    import collections

    from mlless.data import safe_pickle

    value = {"a": [1, 2.5, "x", b"y", None, (True, -3)], "pixels": np.arange(6, dtype=np.int16).reshape(2, 3)}
    got = safe_pickle.load(pickle.dumps(value))
    assert got["a"] == value["a"] and np.array_equal(got["pixels"], value["pixels"])
    assert got["pixels"].dtype == np.int16
    for refused, says in ((np.array([{}, 1], dtype=object), "an array of object"),
                          (np.zeros(3), "an array of float64"),
                          (collections.OrderedDict(a=1), "names collections.OrderedDict"),
                          (np.ma.masked_array([1, 2]), "names numpy.ma.core"),
                          (Shell("true"), "names posix.system")):
        for protocol in (2, pickle.DEFAULT_PROTOCOL):
            with pytest.raises(pickle.UnpicklingError, match=says):
                safe_pickle.load(pickle.dumps(refused, protocol=protocol))


def test_a_damaged_cifar_input_is_refused_in_one_line_and_a_pickle_runs_nothing(tmp_path, capsys):
    for case, (src, says) in cifar_cases(tmp_path).items():
        assert prepare("--format", "cifar", str(src), "--out", str(tmp_path / "ds")) == EXIT_FAILED, case
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(src) in err and says in err, (case, err)
    assert not (tmp_path / "ran").exists()
    assert prepare("--format", "cifar", str(tmp_path / "c"), "--out", str(tmp_path / "ds")) == EXIT_FAILED
    assert "no CIFAR batch files of the train part" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------- MNIST


def idx(array: np.ndarray) -> bytes:
    """An idx file of unsigned bytes: two zero bytes, type 0x08, the dimensions, each a big-endian uint32."""
    return bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def mnist_files(folder: Path, prefix: str, images: np.ndarray, labels: np.ndarray, gz: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gz else ""
    for name, array in ((f"{prefix}-images-idx3-ubyte", images), (f"{prefix}-labels-idx1-ubyte", labels)):
        (folder / (name + suffix)).write_bytes(gzip.compress(idx(array)) if gz else idx(array))
    return folder / f"{prefix}-images-idx3-ubyte{suffix}"


def test_an_mnist_directory_of_gzipped_and_plain_idx_files_reads_back_exactly(tmp_path):
    train, train_y = noise(300, 28, 28), (np.arange(300) % 10).astype(np.uint8)
    test, test_y = noise(50, 28, 28, seed=3), (np.arange(50) % 10).astype(np.uint8)
    mnist_files(tmp_path / "fashion", "train", train, train_y, gz=True)
    mnist_files(tmp_path / "fashion", "t10k", test, test_y, gz=False)
    assert prepare("--format", "mnist", str(tmp_path / "fashion"), "--out", str(tmp_path / "a")) == 0
    ds, got_x, got_y, val_x, val_y = read_back(tmp_path / "a")
    assert got_x.shape[1:] == (1, 28, 28) and ds.dims()["n_classes"] == 10
    assert rows_of(got_x, got_y) | rows_of(val_x, val_y) == rows_of(train[:, None], train_y)

    assert prepare("--format", "mnist", str(tmp_path / "fashion"), "--validation", str(tmp_path / "fashion"),
                   "--out", str(tmp_path / "b")) == 0
    _, got_x, got_y, val_x, val_y = read_back(tmp_path / "b")
    assert rows_of(got_x, got_y) == rows_of(train[:, None], train_y)
    np.testing.assert_array_equal(val_x[:, 0], test)
    np.testing.assert_array_equal(val_y, test_y)


def test_an_mnist_images_file_finds_its_labels_beside_it(tmp_path):
    images, labels = noise(40, 6, 5), (np.arange(40) % 4).astype(np.uint8)
    src = mnist_files(tmp_path, "train", images, labels, gz=False)
    held = mnist_files(tmp_path, "t10k", noise(8, 6, 5, seed=4), (np.arange(8) % 4).astype(np.uint8), gz=True)
    assert prepare("--format", "mnist", str(src), "--validation", str(held), "--out", str(tmp_path / "ds")) == 0
    _, got_x, got_y, val_x, _ = read_back(tmp_path / "ds")
    assert rows_of(got_x, got_y) == rows_of(images[:, None], labels) and len(val_x) == 8


def mnist_cases(tmp_path: Path) -> dict[str, tuple[Path, Path, str]]:
    """Damaged MNIST inputs: the INPUT, the file the error line names, and what it says besides."""
    images, labels = noise(20, 4, 4), (np.arange(20) % 2).astype(np.uint8)

    def folder(name: str, gz: bool = False) -> Path:
        return mnist_files(tmp_path / name, "train", images, labels, gz)

    short = cut(folder("short"))
    gz = cut(folder("gz", gz=True), 0.8)
    signed = folder("signed")
    signed.write_bytes(b"\0\0\x09" + signed.read_bytes()[3:])
    counted = folder("count")
    (tmp_path / "count" / "train-labels-idx1-ubyte").write_bytes(idx(np.zeros(21, np.uint8)))
    alone = folder("alone")
    (tmp_path / "alone" / "train-labels-idx1-ubyte").unlink()
    flat = folder("flat")
    flat.write_bytes(idx(images.reshape(20, 16)))
    labels_file = tmp_path / "count" / "train-labels-idx1-ubyte"
    return {
        "truncated": (short.parent, short, "truncated"),
        "truncated gzip": (gz.parent, gz, "not a readable gzip file"),
        "signed bytes": (signed.parent, signed, "idx type 0x09"),
        "more labels": (counted.parent, labels_file, "21 labels for the 20 images"),
        "no labels beside": (alone, tmp_path / "alone" / "train-labels-idx1-ubyte", "input file not found"),
        "no labels in folder": (alone.parent, alone.parent, "no train-labels-idx1-ubyte (or .gz) in it"),
        "two dimensions": (flat.parent, flat, "an idx array of 2 dimensions"),
        "not images by name": (labels_file, labels_file, "not an idx images file by its name"),
    }


def test_a_damaged_mnist_input_is_refused_in_one_line_naming_the_file(tmp_path, capsys):
    for case, (src, named, says) in mnist_cases(tmp_path).items():
        assert prepare("--format", "mnist", str(src), "--out", str(tmp_path / "ds")) == EXIT_FAILED, case
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(named) in err and says in err, (case, err)
    (tmp_path / "empty").mkdir()
    assert prepare("--format", "mnist", str(tmp_path / "empty"), "--out", str(tmp_path / "ds")) == EXIT_FAILED
    assert "no train-images-idx3-ubyte (or .gz)" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------- image folder

Image = pytest.importorskip("PIL.Image")


def save(path: Path, pixels: np.ndarray, fmt: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, fmt)
    return path


def decoded(path: Path, mode: str, size: tuple[int, int] | None = None) -> np.ndarray:
    """What Pillow makes of a file, channels first, as the reader should have."""
    with Image.open(path) as image:
        image = image.convert(mode)
        pixels = np.asarray(image.resize(size, Image.Resampling.BILINEAR) if size else image)
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)


def test_a_folder_of_png_and_jpeg_classes_reads_as_pillow_decodes_it(tmp_path):
    files = {}
    for k, label in enumerate(["owl", "cat", "emu"]):
        for i in range(6):
            fmt, suffix = ("PNG", "png") if i % 2 else ("JPEG", "JPG")
            files[save(tmp_path / "photos" / label / f"{i}.{suffix}", noise(1, 5, 7, 3, seed=10 * k + i)[0], fmt)] \
                = sorted(["owl", "cat", "emu"]).index(label)
    (tmp_path / "photos" / "owl" / "notes.txt").write_text("not an image")
    assert prepare("--format", "image-folder", str(tmp_path / "photos"), "--out", str(tmp_path / "ds"),
                   "--validation-fraction", "0.25") == 0
    ds, got_x, got_y, val_x, val_y = read_back(tmp_path / "ds")
    assert got_x.shape[1:] == (3, 5, 7) and ds.manifest.feature_stats["label_values"] == ["cat", "emu", "owl"]
    expected = {decoded(path, "RGB").tobytes(): label for path, label in files.items()}
    assert rows_of(got_x, got_y) | rows_of(val_x, val_y) == expected and len(expected) == 18
    # The PNGs are lossless: their pixels are the ones written.
    png = next(path for path in files if path.suffix == ".png")
    assert decoded(png, "RGB").tobytes() in expected and np.array_equal(decoded(png, "RGB").transpose(1, 2, 0),
                                                                         np.asarray(Image.open(png)))


def test_a_gray_folder_is_one_channel_and_image_size_resizes(tmp_path):
    files = {}
    for k, label in enumerate(["0", "1"]):
        for i in range(5):
            files[save(tmp_path / "digits" / label / f"{i}.png", noise(1, 9 + i, 6, seed=20 + 5 * k + i)[0],
                       "PNG")] = k
    assert prepare("--format", "image-folder", str(tmp_path / "digits"), "--image-size", "4x3",
                   "--out", str(tmp_path / "ds")) == 0
    ds, got_x, got_y, val_x, val_y = read_back(tmp_path / "ds")
    assert got_x.shape[1:] == (1, 3, 4) and ds.manifest.source["image_size"] == [4, 3]
    expected = {decoded(path, "L", (4, 3)).tobytes(): label for path, label in files.items()}
    assert rows_of(got_x, got_y) | rows_of(val_x, val_y) == expected
    # Another size of the same gray images, without resizing: each must have the first one's size.
    assert prepare("--format", "image-folder", str(tmp_path / "digits"), "--out", str(tmp_path / "no")) == EXIT_FAILED


def test_a_validation_folder_takes_the_training_folders_channels_and_its_unknown_class_is_dropped(tmp_path):
    for label in ("a", "b"):
        for i in range(4):
            save(tmp_path / "train" / label / f"{i}.png", noise(1, 4, 4, seed=i + ord(label))[0], "PNG")
    colour = save(tmp_path / "val" / "a" / "x.png", noise(1, 4, 4, 3, seed=50)[0], "PNG")
    save(tmp_path / "val" / "z" / "y.png", noise(1, 4, 4, seed=51)[0], "PNG")
    assert prepare("--format", "image-folder", str(tmp_path / "train"), "--validation", str(tmp_path / "val"),
                   "--out", str(tmp_path / "ds")) == 0
    ds, got_x, _, val_x, val_y = read_back(tmp_path / "ds")
    assert len(got_x) == 8 and got_x.shape[1:] == (1, 4, 4)
    np.testing.assert_array_equal(val_x, decoded(colour, "L")[None])
    assert val_y.tolist() == [0] and ds.manifest.n_validation_dropped == 1


def test_a_damaged_image_or_a_missing_pillow_is_one_line(tmp_path, capsys, monkeypatch):
    for i in range(3):
        for label in ("a", "b"):
            save(tmp_path / "set" / label / f"{i}.png", noise(1, 4, 4, 3, seed=i)[0], "PNG")
    bad = cut(tmp_path / "set" / "b" / "1.png", 0.5)
    assert prepare("--format", "image-folder", str(tmp_path / "set"), "--out", str(tmp_path / "ds")) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bad}: not a readable PNG or JPEG image" in err, err
    for argv, says in ((["--image-size", "0"], "not one side or WIDTHxHEIGHT"),):
        with pytest.raises(SystemExit) as exc:
            prepare("--format", "image-folder", str(tmp_path / "set"), *argv, "--out", str(tmp_path / "ds"))
        assert exc.value.code == EXIT_USAGE and says in capsys.readouterr().err
    assert prepare("--format", "mnist", str(tmp_path), "--image-size", "8", "--out", str(tmp_path / "d")) == EXIT_USAGE
    assert "--image-size goes with --format image-folder" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "PIL", None)  # import fails
    assert prepare("--format", "image-folder", str(tmp_path / "set"), "--out", str(tmp_path / "ds")) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install pillow" in err


# --------------------------------------------------------------------------------------------------- the command


def test_the_command_refuses_a_damaged_file_of_each_format_without_a_traceback(tmp_path):
    """`python -m mlless prepare`, as a user runs it: one line on stderr naming the file, exit status 1."""
    cases = {"cifar": cifar_cases(tmp_path / "c")["truncated archive"][0],
             "mnist": mnist_cases(tmp_path / "m")["truncated gzip"][1]}
    save(tmp_path / "f" / "a" / "0.png", noise(1, 4, 4, 3)[0], "PNG")
    cases["image-folder"] = tmp_path / "f" / "b" / "0.jpg"
    cases["image-folder"].parent.mkdir()
    cases["image-folder"].write_bytes(b"\xff\xd8\xff\xe0 not really a JPEG")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for fmt, named in cases.items():
        src = named.parent if fmt == "mnist" else tmp_path / "f" if fmt == "image-folder" else named
        done = subprocess.run([sys.executable, "-m", "mlless", "prepare", "--format", fmt, str(src),
                               "--out", str(tmp_path / "ds")], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == EXIT_FAILED and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1 and str(named) in done.stderr, done.stderr
        assert not (tmp_path / "ds" / "manifest.json").exists()
