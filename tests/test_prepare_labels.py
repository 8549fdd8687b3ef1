"""Class labels in `mlless prepare --labels classes` (#23): any K distinct values (words in a CSV, 1..K or any
integers in LIBSVM) become classes 0 … K − 1 with the file's values in the manifest; label sets that do not fit a
model and validation files that do not fit the training file are refused in one line naming the file and line or
the field; a softmax trains on a CSV whose classes are words."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mlless.cli import main
from mlless.data.dataset import Dataset
from mlless.runtime.local import Services, train_local
from mlless.training.models import load_model

from test_training import QUIET, job_for


def prepare(tmp_path: Path, name: str, text: str, *args: str) -> int:
    (tmp_path / name).write_text(text)
    fmt = "csv" if name.endswith(".csv") else "libsvm"
    return main(["prepare", "--format", fmt, str(tmp_path / name), "--out", str(tmp_path / "data"), "--quiet",
                 "--labels", "classes", *args])


def rows(ds: Dataset) -> dict[tuple[tuple[int, float], ...], float]:
    """Each row's label by its (feature index, value) pairs (the rows of these tests differ in them)."""
    out = {}
    for batch in [ds.batch(i) for i in range(ds.n_batches)] + [ds.validation()]:
        for r in range(len(batch)):
            at = slice(batch.indptr[r], batch.indptr[r + 1])
            out[tuple(zip(batch.indices[at].tolist(), batch.values[at].tolist()))] = float(batch.labels[r])
    return out


def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_words_in_a_csv_are_classes_numbered_in_sorted_order(tmp_path):
    text = "a,b,animal\n1,0,dog\n0,1,cat\n1,1, fish\n2,0,dog\n"
    assert prepare(tmp_path, "in.csv", text, "--label", "animal", "--validation-fraction", "0") == 0
    ds = Dataset.open(str(tmp_path / "data"))
    stats = ds.manifest.feature_stats
    assert stats["label_values"] == ["cat", "dog", "fish"] and stats["label_classes"] == [0, 1, 2]
    assert ds.dims()["classes"] == [0, 1, 2]
    assert rows(ds) == {((0, 1.0), (1, 0.0)): 1.0, ((0, 0.0), (1, 1.0)): 0.0, ((0, 1.0), (1, 1.0)): 2.0,
                        ((0, 2.0), (1, 0.0)): 1.0}


def test_any_integers_in_libsvm_are_classes_and_the_label_mean_is_of_the_classes(tmp_path):
    text = "42 1:1\n-3 2:1\n10 3:1\n42 4:1\n+10 5:1\n10.0 6:1\n"
    assert prepare(tmp_path, "in.svm", text, "--validation-fraction", "0") == 0
    ds = Dataset.open(str(tmp_path / "data"))
    assert ds.manifest.feature_stats["label_values"] == [-3, 10, 42]
    assert rows(ds) == {((i, 1.0),): label for i, label in enumerate([2.0, 0.0, 1.0, 2.0, 1.0, 1.0])}
    assert ds.manifest.feature_stats["label_mean"] == sum([2, 0, 1, 2, 1, 1]) / 6


def test_a_class_label_that_is_a_fraction_is_named_with_its_line(tmp_path, capsys):
    assert prepare(tmp_path, "in.svm", "1 1:1\n2 2:1\n2.5 3:1\n") != 0
    line = one_error(capsys)
    assert "in.svm:3: a class label that is a number must be an integer (--labels real reads values to regress on)" \
        in line, line
    assert not (tmp_path / "data" / "manifest.json").exists()


def job_file(tmp_path: Path, model: str) -> Path:
    job = tmp_path / f"{model}.yaml"
    job.write_text("apiVersion: mlless.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: labels}\n"
                   f"spec: {{model: {{type: {model}}}, dataset: {{uri: {tmp_path / 'data'}}}}}\n")
    return job


def test_three_classes_are_refused_for_the_svm_and_two_words_are_binary(tmp_path, capsys):
    assert prepare(tmp_path, "in.csv", "x,y\n1,cat\n2,dog\n3,fish\n", "--label", "y", "--validation-fraction", "0") == 0
    job = job_file(tmp_path, "svm")
    assert main(["train", str(job), "--out", str(tmp_path / "run")]) != 0
    assert one_error(capsys) == (f"mlless: error: {job}: spec.model.type svm fits binary labels, and "
                                 f"{tmp_path / 'data'} holds 3 classes (cat, dog, fish) (mlless prepare --labels)")
    assert prepare(tmp_path, "two.csv", "x,y\n1,no\n2,yes\n3,no\n", "--label", "y", "--validation-fraction", "0") == 0
    ds = Dataset.open(str(tmp_path / "data"))
    assert ds.manifest.feature_stats["label_values"] == ["no", "yes"]
    assert ds.fits(frozenset({"binary"})) and not ds.fits(frozenset({"real"}))


def test_a_validation_file_with_a_class_the_training_file_lacks_is_named_with_its_line(tmp_path, capsys):
    (tmp_path / "valid.csv").write_text("x,y\n1,cat\n2,bird\n")
    assert prepare(tmp_path, "in.csv", "x,y\n1,cat\n2,dog\n", "--label", "y", "--validation",
                   str(tmp_path / "valid.csv")) != 0
    line = one_error(capsys)
    assert f"{tmp_path / 'valid.csv'}:3: column y: label 'bird' is none of the training file's classes" in line, line
    assert not (tmp_path / "data" / "manifest.json").exists()


def test_a_validation_file_beyond_the_training_features_is_named_with_its_line(tmp_path, capsys):
    (tmp_path / "valid.svm").write_text("1 1:1\n2 2:1 9:0.5\n")
    assert prepare(tmp_path, "in.svm", "1 1:1\n2 2:1 3:1\n", "--validation", str(tmp_path / "valid.svm")) != 0
    line = one_error(capsys)
    assert f"{tmp_path / 'valid.svm'}:2: a feature index beyond the training file's largest, 3: '9'" in line, line
    # the rows that fit are kept when the others are skipped
    assert prepare(tmp_path, "in.svm", "1 1:1\n2 2:1 3:1\n", "--validation", str(tmp_path / "valid.svm"),
                   "--on-error", "skip") == 0
    ds = Dataset.open(str(tmp_path / "data"))
    assert (ds.manifest.n_validation, ds.manifest.skipped_lines, ds.manifest.n_features) == (1, 1, 3)


def test_a_softmax_learns_word_classes_from_a_csv_at_p1(tmp_path):
    rng = np.random.default_rng(5)
    n, names = 3000, np.array(["bird", "cat", "dog"])
    x = rng.normal(0, 1, (n, 2))
    colour = rng.choice(["red", "green"], n)
    score = np.stack([x[:, 0], x[:, 1], -x[:, 0] - x[:, 1] + (colour == "red")], 1) + rng.gumbel(0, 0.3, (n, 3))
    truth = names[score.argmax(1)]
    lines = ["u,v,colour,kind", *(f"{a:.4f},{b:.4f},{c},{k}" for (a, b), c, k in zip(x, colour, truth))]
    assert prepare(tmp_path, "animals.csv", "\n".join(lines) + "\n", "--label", "kind", "--batch-size", "200") == 0
    ds = Dataset.open(str(tmp_path / "data"))
    assert ds.manifest.feature_stats["label_values"] == ["bird", "cat", "dog"]
    summary = train_local(job_for(tmp_path / "data", workers=1, model={"type": "softmax"}, stop={"maxEpochs": 5}),
                          tmp_path / "run", Services(), QUIET)
    validation = ds.validation()
    shares = np.bincount(validation.labels.astype(int), minlength=3) / len(validation)
    model = load_model(tmp_path / "run" / "model.npz")
    predicted = np.array(ds.manifest.feature_stats["label_values"])[model.predict(validation).argmax(axis=1)]
    wanted = np.array(ds.manifest.feature_stats["label_values"])[validation.labels.astype(int)]
    accuracy = float(np.mean(predicted == wanted))
    # well above always naming the most frequent class, and as the run's own evaluation says
    assert accuracy > shares.max() + 0.2, (accuracy, shares)
    assert summary["validation_scores"]["accuracy"] == accuracy
