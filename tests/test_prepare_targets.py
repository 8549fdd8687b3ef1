"""Image data sets of real targets: `mlless prepare --format npz --labels real` keeps each image's `y` as a float32
number to regress on (neural-net-regression), records the label kind and the training targets' mean and deviation
in the manifest, and refuses a target that is no finite number, or a batch or manifest that says otherwise, in one
line naming the file."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mlless.contract import EXIT_FAILED, EXIT_USAGE
from mlless.data.dataset import Dataset
from test_prepare_images import noise, one_line_error, prepare, read_back, replace_batch, write_npz

DIMS = {"channels", "height", "width", "label_mean", "label_std", "pixel_mean", "pixel_std"}


def targets_of(images: np.ndarray, targets: np.ndarray) -> dict[bytes, float]:
    return {image.tobytes(): float(target) for image, target in zip(images, targets)}


def test_real_targets_read_back_as_float32_with_their_statistics(tmp_path):
    x = noise(400, 6, 5)
    y = np.random.default_rng(3).normal(40.0, 7.0, 400)  # float64: kept as the nearest float32
    src = write_npz(tmp_path / "r.npz", X=x, y=y)
    assert prepare("--format", "npz", str(src), "--labels", "real", "--out", str(tmp_path / "ds"),
                   "--batch-size", "64") == 0
    ds, train_x, train_y, val_x, val_y = read_back(tmp_path / "ds")

    assert train_y.dtype == val_y.dtype == np.float32 and len(train_x) + len(val_x) == 400
    assert targets_of(train_x, train_y) | targets_of(val_x, val_y) == targets_of(x[:, None], y.astype(np.float32))
    assert ds.labels == "real" and ds.label_set() == "real labels" and ds.manifest.source["labels"] == "real"
    assert ds.manifest.n_classes is None and set(ds.dims()) == DIMS
    # The statistics are the training targets' as stored (float32), not the validation images'.
    assert ds.dims()["label_mean"] == pytest.approx(train_y.astype(np.float64).mean(), rel=1e-12)
    assert ds.dims()["label_std"] == pytest.approx(train_y.astype(np.float64).std(), rel=1e-12)
    assert ds.fits(frozenset({"real"})) and not ds.fits(frozenset({"classes"}))


def test_integer_targets_and_a_validation_file_are_kept_whole(tmp_path):
    """Integers are numbers too, and a validation file's images all validate: no target is a class to drop."""
    train = write_npz(tmp_path / "train.npz", X=noise(50, 4, 4), y=np.arange(50) * 3)
    held_x = noise(9, 4, 4, seed=7)
    held = write_npz(tmp_path / "val.npz", X=held_x, y=np.arange(9) * 1000)  # none of the training values
    assert prepare("--format", "npz", str(train), "--labels", "real", "--validation", str(held),
                   "--out", str(tmp_path / "ds")) == 0
    ds, train_x, train_y, val_x, val_y = read_back(tmp_path / "ds")
    assert sorted(train_y.tolist()) == list(range(0, 150, 3))
    np.testing.assert_array_equal(val_x[:, 0], held_x)
    assert val_y.tolist() == list(range(0, 9000, 1000)) and ds.manifest.n_validation_dropped == 0


BAD_TARGETS = {
    "nan": (lambda n: np.where(np.arange(n) == 5, np.nan, 1.0 * np.arange(n)), "y[5] is nan"),
    "inf": (lambda n: np.where(np.arange(n) == 2, -np.inf, 1.0 * np.arange(n)), "y[2] is -inf"),
    "beyond float32": (lambda n: np.where(np.arange(n) == 7, 1e39, 1.0 * np.arange(n)), "y[7] is 1e+39"),
    "words": (lambda n: np.array(["a", "b"])[np.arange(n) % 2], "must hold real targets, numbers, got <U1"),
    "two a row": (lambda n: np.zeros((n, 2)), "one label per image"),
    "constant": (lambda n: np.full(n, 2.5), "every training target is 2.5"),
}


@pytest.mark.parametrize("case", list(BAD_TARGETS))
def test_a_target_that_is_no_finite_number_is_refused_naming_the_file(tmp_path, capsys, case):
    make, says = BAD_TARGETS[case]
    src = write_npz(tmp_path / "bad.npz", X=noise(40, 4, 4), y=make(40))
    assert prepare("--format", "npz", str(src), "--labels", "real", "--out", str(tmp_path / "ds")) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(src) in err and says in err, err
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_real_labels_go_with_npz_alone_and_images_take_no_binary_labels(tmp_path, capsys):
    src = write_npz(tmp_path / "in.npz", X=noise(40, 4, 4), y=np.arange(40) % 2)
    for argv, says in ((["--format", "mnist", str(tmp_path), "--labels", "real"], "real targets come in --format npz"),
                       (["--sample", "digits", "--labels", "real"], "does not go with --sample digits"),
                       (["--format", "npz", str(src), "--labels", "binary"], "its images' labels are classes")):
        assert prepare(*argv, "--out", str(tmp_path / "ds")) == EXIT_USAGE
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
    # A fractional label read as a class points at --labels real.
    fractions = write_npz(tmp_path / "f.npz", X=noise(40, 4, 4), y=np.arange(40) / 4)
    assert prepare("--format", "npz", str(fractions), "--out", str(tmp_path / "ds")) == EXIT_FAILED
    assert "--labels real" in capsys.readouterr().err


@pytest.fixture()
def targets_dir(tmp_path: Path) -> Path:
    src = write_npz(tmp_path / "in.npz", X=noise(200, 5, 5), y=np.linspace(-1, 1, 200))
    assert prepare("--format", "npz", str(src), "--labels", "real", "--out", str(tmp_path / "ds"),
                   "--batch-size", "40") == 0
    return tmp_path / "ds"


@pytest.mark.parametrize("labels, says", [
    (np.zeros(40, np.int32), "labels of int32, and the manifest's source says real labels (float32)"),
    (np.full(40, np.nan, np.float32), "non-finite label"),
    (np.zeros(40, np.float64), "must be int32 class ids or float32 real targets, got float64"),
])
def test_a_batch_whose_labels_are_not_the_manifests_kind_is_refused_by_name(targets_dir, labels, says):
    replace_batch(targets_dir, "train/batch-000000.npz", {"images": noise(40, 1, 5, 5), "labels": labels})
    error = one_line_error(targets_dir)
    assert "train/batch-000000.npz" in error and says in error, error


def test_a_class_set_refuses_a_batch_of_real_targets(tmp_path):
    src = write_npz(tmp_path / "in.npz", X=noise(80, 5, 5), y=np.arange(80) % 4)
    assert prepare("--format", "npz", str(src), "--out", str(tmp_path / "ds"), "--batch-size", "40") == 0
    replace_batch(tmp_path / "ds", "train/batch-000000.npz",
                  {"images": noise(40, 1, 5, 5), "labels": np.zeros(40, np.float32)})
    assert "the manifest's source says classes labels (int32)" in one_line_error(tmp_path / "ds")


@pytest.mark.parametrize("changes, says", [
    ({"n_classes": 3}, "'n_classes' is 3, and the labels are real"),
    ({"feature_stats": {"label_mean": 0.0, "label_std": 0.0}}, "'feature_stats.label_std' of real labels is 0.0"),
    ({"feature_stats": {"label_std": 1.0}}, "'feature_stats.label_mean' of real labels is None"),
    ({"source": {"format": "npz", "labels": "binary"}}, "'source.labels' of images is 'binary'"),
])
def test_a_manifest_of_real_targets_without_their_statistics_is_refused_by_name(targets_dir, changes, says):
    manifest = json.loads((targets_dir / "manifest.json").read_text())
    manifest.update(changes)
    (targets_dir / "manifest.json").write_text(json.dumps(manifest))
    error = one_line_error(targets_dir, lambda ds: None)
    assert "manifest.json" in error and says in error, error


def test_a_class_set_without_its_classes_is_refused(tmp_path):
    src = write_npz(tmp_path / "in.npz", X=noise(80, 5, 5), y=np.arange(80) % 4)
    assert prepare("--format", "npz", str(src), "--out", str(tmp_path / "ds")) == 0
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    del manifest["source"]["labels"]  # a manifest written before the kind was recorded: classes
    (tmp_path / "ds" / "manifest.json").write_text(json.dumps(manifest))
    assert Dataset.open(str(tmp_path / "ds")).labels == "classes"
    manifest["n_classes"] = None
    (tmp_path / "ds" / "manifest.json").write_text(json.dumps(manifest))
    assert "'n_classes' must not be null" in one_line_error(tmp_path / "ds", lambda ds: None)
