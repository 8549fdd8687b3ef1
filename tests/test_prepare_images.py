"""Image data sets: `mlless prepare --format npz` and `--sample digits` written, read back through `Dataset`, and
every bad input or batch file refused in one line naming it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlless.contract import EXIT_FAILED, EXIT_USAGE
from mlless.data.batches import ImageBatch
from mlless.data.cli import main as prepare_main
from mlless.data.dataset import Dataset, DatasetError
from mlless.data.npz import npz_bytes, sha256

DIMS = {"channels", "height", "width", "n_classes", "pixel_mean", "pixel_std"}


def write_npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def prepare(*argv: str) -> int:
    return prepare_main(["prepare", "--quiet", *argv])


def noise(rows: int, *shape: int, seed: int = 0) -> np.ndarray:
    """Random images: no two alike, so each can be found again after the shuffle."""
    return np.random.default_rng(seed).integers(0, 256, (rows, *shape), dtype=np.uint8)


def read_back(out: Path) -> tuple[Dataset, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    ds = Dataset.open(str(out))
    train = [ds.batch(i) for i in range(ds.n_batches)]
    assert all(isinstance(b, ImageBatch) for b in train)
    images = np.concatenate([b.images for b in train])
    labels = np.concatenate([b.labels for b in train])
    val = ds.validation()
    return ds, images, labels, val.images, val.labels


def rows_of(images: np.ndarray, labels: np.ndarray) -> dict[bytes, int]:
    return {image.tobytes(): int(label) for image, label in zip(images, labels)}


def test_grayscale_npz_reads_back_split_shuffled_and_with_its_statistics(tmp_path):
    x, y = noise(530, 7, 5), np.random.default_rng(1).integers(0, 4, 530)
    src = write_npz(tmp_path / "gray.npz", X=x, y=y)
    assert prepare("--format", "npz", str(src), "--out", str(tmp_path / "ds"), "--batch-size", "50") == 0
    ds, train_x, train_y, val_x, val_y = read_back(tmp_path / "ds")

    assert ds.kind == "images" and set(ds.dims()) == DIMS
    assert train_x.shape[1:] == val_x.shape[1:] == (1, 7, 5) and train_x.dtype == np.uint8
    assert [len(ds.batch(i)) for i in range(ds.n_batches)] == [50] * 9 + [len(train_x) - 450]
    # Every input image is in exactly one split, with its label; the validation split is about a tenth.
    assert len(train_x) + len(val_x) == 530 and 25 <= len(val_x) <= 85
    given = rows_of(x[:, None], y)
    assert rows_of(train_x, train_y) | rows_of(val_x, val_y) == given
    assert not rows_of(train_x, train_y).keys() & rows_of(val_x, val_y).keys()
    # Shuffled: the training images are not in the input's order.
    positions = [list(given).index(image.tobytes()) for image in train_x[:20]]
    assert positions != sorted(positions)

    dims = ds.dims()
    assert dims["channels"] == 1 and (dims["height"], dims["width"]) == (7, 5) and dims["n_classes"] == 4
    np.testing.assert_allclose(dims["pixel_mean"], [train_x.astype(np.float64).mean()], rtol=1e-12)
    np.testing.assert_allclose(dims["pixel_std"], [train_x.astype(np.float64).std()], rtol=1e-12)
    assert ds.label_set().startswith("4 classes") and ds.fits(frozenset({"classes"}))


def test_channels_last_colour_npz_is_stored_channels_first_with_statistics_per_channel(tmp_path):
    x = noise(300, 4, 6, 3)
    x[..., 2] //= 4  # channels that differ, so the statistics are told apart
    y = np.arange(300) % 3
    src = write_npz(tmp_path / "rgb.npz", X=x, y=y)
    assert prepare("--format", "npz", str(src), "--out", str(tmp_path / "ds"), "--validation-fraction", "0.2") == 0
    ds, train_x, train_y, val_x, val_y = read_back(tmp_path / "ds")

    assert train_x.shape[1:] == (3, 4, 6) and ds.dims()["channels"] == 3
    assert rows_of(train_x, train_y) | rows_of(val_x, val_y) == rows_of(x.transpose(0, 3, 1, 2), y)
    wide = train_x.astype(np.float64)
    np.testing.assert_allclose(ds.dims()["pixel_mean"], wide.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(ds.dims()["pixel_std"], wide.std(axis=(0, 2, 3)), rtol=1e-12)
    assert ds.dims()["pixel_mean"][2] < 64


def test_float_pixels_are_scaled_and_word_labels_become_sorted_classes(tmp_path):
    x = np.random.default_rng(2).random((120, 3, 3))
    words = np.array(["pear", "apple", "fig"])[np.arange(120) % 3]
    src = write_npz(tmp_path / "f.npz", X=x, y=words)
    assert prepare("--format", "npz", str(src), "--out", str(tmp_path / "ds"), "--seed", "5") == 0
    ds, train_x, train_y, val_x, val_y = read_back(tmp_path / "ds")

    classes = {"apple": 0, "fig": 1, "pear": 2}
    expected = np.rint(x * 255).astype(np.uint8)[:, None]
    assert rows_of(train_x, train_y) | rows_of(val_x, val_y) == rows_of(expected, [classes[w] for w in words])
    assert ds.manifest.feature_stats["label_values"] == ["apple", "fig", "pear"] and ds.dims()["n_classes"] == 3
    assert ds.manifest.source == {"format": "npz", "path": str(src), "labels": "classes"} and ds.manifest.seed == 5


def test_the_split_follows_the_seed_and_the_validation_cap(tmp_path):
    src = write_npz(tmp_path / "s.npz", X=noise(400, 4, 4), y=np.arange(400) % 2)
    held = {}
    for seed in (0, 1):
        assert prepare("--format", "npz", str(src), "--out", str(tmp_path / f"s{seed}"), "--seed", str(seed)) == 0
        held[seed] = set(rows_of(*read_back(tmp_path / f"s{seed}")[3:]))
    assert held[0] != held[1]
    assert prepare("--format", "npz", str(src), "--out", str(tmp_path / "again"), "--seed", "0") == 0
    assert (tmp_path / "again" / "manifest.json").read_bytes() == (tmp_path / "s0" / "manifest.json").read_bytes()
    assert prepare("--format", "npz", str(src), "--out", str(tmp_path / "cap"), "--max-validation-rows", "7") == 0
    assert Dataset.open(str(tmp_path / "cap")).manifest.n_validation == 7


def test_the_digits_sample_holds_scikit_learns_digits_on_the_0_255_scale(tmp_path):
    from sklearn.datasets import load_digits

    assert prepare("--sample", "digits", "--out", str(tmp_path / "digits")) == 0
    ds, train_x, train_y, val_x, val_y = read_back(tmp_path / "digits")
    digits = load_digits()
    assert ds.dims()["n_classes"] == 10 and train_x.shape[1:] == (1, 8, 8)
    assert len(train_x) + len(val_x) == len(digits.target) == 1797 and 120 <= len(val_x) <= 240
    assert ds.manifest.batch_size == 64 and ds.manifest.source["sample"] == "digits"
    # Each image is one of scikit-learn's with its digit (some images occur twice, with the same digit).
    scaled = rows_of(np.rint(digits.images * 255 / 16).astype(np.uint8)[:, None], digits.target)
    assert rows_of(np.concatenate([train_x, val_x]), np.concatenate([train_y, val_y])) == scaled
    assert int(train_x.max()) == 255
    np.testing.assert_allclose(ds.dims()["pixel_std"], [train_x.astype(np.float64).std()], rtol=1e-12)


def test_the_digits_sample_without_scikit_learn_says_what_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # import fails
    assert prepare("--sample", "digits", "--out", str(tmp_path / "d")) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "scikit-learn" in err and "pip install" in err


BAD_INPUTS = {
    "garbage": (lambda p: p.write_bytes(b"not an npz at all"), "not a readable npz"),
    "no y": (lambda p: write_npz(p, X=noise(10, 4, 4)), "no array 'y'"),
    "flat X": (lambda p: write_npz(p, X=noise(10, 16), y=np.arange(10) % 2), "shape (n, height, width)"),
    "channels first": (lambda p: write_npz(p, X=noise(10, 3, 8, 8), y=np.arange(10) % 2), "channels-first"),
    "float above 1": (lambda p: write_npz(p, X=noise(10, 4, 4).astype(np.float32), y=np.arange(10) % 2),
                      "float pixels must be in [0, 1]"),
    "NaN pixel": (lambda p: write_npz(p, X=np.full((10, 4, 4), np.nan), y=np.arange(10) % 2), "not a finite number"),
    "int above 255": (lambda p: write_npz(p, X=np.full((10, 4, 4), 300), y=np.arange(10) % 2), "[0, 255]"),
    "bool pixels": (lambda p: write_npz(p, X=np.ones((10, 4, 4), bool), y=np.arange(10) % 2), "got bool"),
    "short y": (lambda p: write_npz(p, X=noise(10, 4, 4), y=np.arange(9) % 2), "one label per image"),
    "fractional y": (lambda p: write_npz(p, X=noise(10, 4, 4), y=np.arange(10) / 4), "fractional"),
    "one class": (lambda p: write_npz(p, X=noise(10, 4, 4), y=np.zeros(10, int)), "1 distinct labels"),
    "pickled y": (lambda p: write_npz(p, X=noise(10, 4, 4), y=np.array([{}, 1] * 5, dtype=object)),
                  "not a readable npz"),
    "constant pixels": (lambda p: write_npz(p, X=np.full((10, 4, 4), 7, np.uint8), y=np.arange(10) % 2),
                        "channel 0 is 7"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_a_bad_npz_is_refused_in_one_line_naming_it_and_the_problem(tmp_path, capsys, case):
    make, says = BAD_INPUTS[case]
    src = tmp_path / "bad.npz"
    make(src)
    assert prepare("--format", "npz", str(src), "--out", str(tmp_path / "ds")) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(src) in err and says in err, err


def test_a_truncated_npz_and_a_missing_one_are_refused_by_name(tmp_path, capsys):
    src = write_npz(tmp_path / "whole.npz", X=noise(50, 6, 6), y=np.arange(50) % 5)
    cut = tmp_path / "cut.npz"
    cut.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    for path in (cut, tmp_path / "absent.npz"):
        assert prepare("--format", "npz", str(path), "--out", str(tmp_path / "ds")) == EXIT_FAILED
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(path) in err, err


def test_the_help_describes_the_images_and_a_validation_file_goes_with_a_format(tmp_path, capsys):
    with pytest.raises(SystemExit):
        prepare_main(["prepare", "--help"])
    help_text = capsys.readouterr().out
    assert "npz" in help_text and "digits" in help_text and "channels-last" in help_text
    for fmt in ("cifar", "mnist", "image-folder", "--image-size"):
        assert fmt in help_text
    assert prepare("--sample", "digits", "--validation", "x.npz", "--out", str(tmp_path / "d")) == EXIT_USAGE


def test_an_npz_validation_file_is_the_validation_split_numbered_by_the_training_classes(tmp_path):
    train = write_npz(tmp_path / "train.npz", X=noise(60, 4, 4), y=np.array(["b", "c", "d"])[np.arange(60) % 3])
    held_x = noise(9, 4, 4, seed=7)
    held = write_npz(tmp_path / "val.npz", X=held_x, y=np.array(["d", "a", "b"])[np.arange(9) % 3])
    assert prepare("--format", "npz", str(train), "--validation", str(held), "--out", str(tmp_path / "ds")) == 0
    ds, train_x, _, val_x, val_y = read_back(tmp_path / "ds")
    assert len(train_x) == 60 and ds.manifest.feature_stats["label_values"] == ["b", "c", "d"]
    # "a" is none of the training classes: its 3 images are dropped and counted.
    np.testing.assert_array_equal(val_x[:, 0], held_x[np.arange(9) % 3 != 1])
    assert val_y.tolist() == [2, 0] * 3 and ds.manifest.n_validation_dropped == 3
    assert ds.manifest.source["validation"] == str(held)
    other = write_npz(tmp_path / "other.npz", X=noise(9, 5, 4), y=np.arange(9) % 3)
    assert prepare("--format", "npz", str(train), "--validation", str(other), "--out", str(tmp_path / "x")) \
        == EXIT_FAILED


# --------------------------------------------------------------------- the prepared files


@pytest.fixture()
def images_dir(tmp_path: Path) -> Path:
    src = write_npz(tmp_path / "in.npz", X=noise(200, 5, 5, 3), y=np.arange(200) % 4)
    assert prepare("--format", "npz", str(src), "--out", str(tmp_path / "ds"), "--batch-size", "40") == 0
    return tmp_path / "ds"


def replace_batch(root: Path, name: str, batch_arrays: dict[str, np.ndarray]) -> None:
    """Write a batch and give the manifest its checksum, so only the reader's own checks can catch it."""
    data = npz_bytes(batch_arrays)
    (root / name).write_bytes(data)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["checksums"][name] = sha256(data)
    (root / "manifest.json").write_text(json.dumps(manifest))


def one_line_error(root: Path, read=lambda ds: ds.batch(0)) -> str:
    with pytest.raises(DatasetError) as exc:
        read(Dataset.open(str(root)))
    assert "\n" not in str(exc.value)
    return str(exc.value)


def test_a_truncated_or_corrupt_batch_is_named(images_dir):
    name = images_dir / "train" / "batch-000001.npz"
    name.write_bytes(name.read_bytes()[:-100])
    assert "batch-000001.npz" in one_line_error(images_dir, lambda ds: ds.batch(1))
    validation = images_dir / "validation.npz"
    validation.write_bytes(validation.read_bytes().replace(b"NUMPY", b"NUMPX", 1))
    assert "validation.npz" in one_line_error(images_dir, lambda ds: ds.validation())


@pytest.mark.parametrize("arrays, says", [
    ({"images": noise(40, 3, 5, 4), "labels": np.zeros(40, np.int32)}, "images of shape (3, 5, 4)"),
    ({"images": noise(40, 3, 5, 5), "labels": np.full(40, 4, np.int32)}, "class id 4 >= n_classes 4"),
    ({"images": noise(40, 3, 5, 5), "labels": np.full(40, -1, np.int32)}, "negative class id"),
    ({"images": noise(40, 3, 5, 5).astype(np.float32), "labels": np.zeros(40, np.int32)}, "must be uint8"),
    ({"images": noise(40, 3, 5, 5), "labels": np.zeros(40, np.int64)}, "must be int32"),
    ({"images": noise(39, 3, 5, 5), "labels": np.zeros(39, np.int32)}, "has 39 rows"),
])
def test_a_batch_of_another_shape_or_class_is_refused_by_name(images_dir, arrays, says):
    replace_batch(images_dir, "train/batch-000000.npz", arrays)
    error = one_line_error(images_dir)
    assert "train/batch-000000.npz" in error and says in error, error


@pytest.mark.parametrize("changes, says", [
    ({"pixel_std": [50.0, 50.0]}, "'pixel_std' must be 3 numbers"),
    ({"pixel_std": [50.0, 0.0, 50.0]}, "'pixel_std' must be 3 numbers in (0, 255]"),
    ({"pixel_mean": [50.0, 300.0, 50.0]}, "'pixel_mean' must be 3 numbers in [0, 255]"),
    ({"channels": 0}, "'channels' is 0"),
    ({"n_classes": 5000}, "'n_classes' is 5000"),
    ({"height": None}, "'height' must not be null"),
    ({"width": KeyError}, "missing field 'width'"),
    ({"kind": "sparse", "n_features": 75}, "'channels' is for images alone"),
])
def test_a_manifest_with_implausible_image_fields_is_refused_by_name(images_dir, changes, says):
    manifest = json.loads((images_dir / "manifest.json").read_text())
    for key, value in changes.items():
        if value is KeyError:
            del manifest[key]
        else:
            manifest[key] = value
    (images_dir / "manifest.json").write_text(json.dumps(manifest))
    error = one_line_error(images_dir, lambda ds: None)
    assert "manifest.json" in error and says in error, error


def test_the_data_layer_never_imports_torch(tmp_path):
    code = ("import sys; from mlless.data.cli import main; from mlless.data.dataset import Dataset; "
            f"main(['prepare', '--quiet', '--sample', 'digits', '--out', {str(tmp_path / 'd')!r}]); "
            f"Dataset.open({str(tmp_path / 'd')!r}).batch(0); assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
