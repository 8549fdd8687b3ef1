"""`mlless prepare --format csv FILE --label COL` (#23): numeric columns as their values, categorical ones hashed as
Criteo's are, bad rows named with their line and column, a validation file read with the training file's columns,
and a model trained on what it gives."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mlless.cli import main
from mlless.data.dataset import Dataset
from mlless.data.hashing import bucket, hash_strings
from mlless.runtime.local import Services, train_local

from test_training import QUIET, job_for

HEADER = "dep_time,distance,carrier,origin,delayed"


def rows_of(ds: Dataset) -> set[tuple[float, tuple[int, ...], tuple[float, ...]]]:
    rows = set()
    for batch in [ds.batch(i) for i in range(ds.n_batches)] + [ds.validation()]:
        for r in range(len(batch)):
            at = slice(batch.indptr[r], batch.indptr[r + 1])
            rows.add((float(batch.labels[r]), tuple(batch.indices[at].tolist()), tuple(batch.values[at].tolist())))
    return rows


def prepare(tmp_path: Path, text: str, *args: str, name: str = "in.csv") -> int:
    (tmp_path / name).write_text(text)
    return main(["prepare", "--format", "csv", str(tmp_path / name), "--out", str(tmp_path / "data"), "--quiet",
                 "--hash-bits", "10", *args])


def test_numeric_columns_are_values_and_categorical_ones_are_hashed_with_their_column(tmp_path):
    text = f'{HEADER}\n1730,2475,AA,JFK,1\n5,,"W,N",,0\r\n\n945,120.5,AA,LAX,0\n'
    assert prepare(tmp_path, text, "--label", "delayed", "--validation-fraction", "0") == 0
    ds = Dataset.open(str(tmp_path / "data"))
    assert ds.manifest.n_features == 1024 and ds.manifest.n_train == 3
    assert ds.manifest.source["numeric_columns"] == ["dep_time", "distance"]
    assert ds.manifest.source["categorical_columns"] == ["carrier", "origin"]

    def hashed(value: str, column: int) -> int:
        return int(bucket(hash_strings([value], column), 2, 1024 - 2)[0])

    assert rows_of(ds) == {
        (1.0, (0, 1, hashed("AA", 2), hashed("JFK", 3)), (1730.0, 2475.0, 1.0, 1.0)),
        (0.0, (0, hashed("W,N", 2)), (5.0, 1.0)),  # empty cells are absent; a quoted comma is one value
        (0.0, (0, 1, hashed("AA", 2), hashed("LAX", 3)), (945.0, 120.5, 1.0, 1.0)),
    }


def test_a_numeric_csv_is_a_dense_set_and_the_label_column_may_be_given_by_position(tmp_path):
    assert prepare(tmp_path, "y,a,b\n2.5,1,2\n-1,3,4\n", "--label", "0", "--labels", "real",
                   "--validation-fraction", "0") == 0
    ds = Dataset.open(str(tmp_path / "data"))
    assert ds.manifest.n_features == 2 and ds.labels == "real"
    assert rows_of(ds) == {(2.5, (0, 1), (1.0, 2.0)), (-1.0, (0, 1), (3.0, 4.0))}


@pytest.mark.parametrize("line, message", [
    ("12,abc,AA,JFK,1", "in.csv:202: column distance: not a finite number ('abc')"),
    ("12,inf,AA,JFK,1", "in.csv:202: column distance: not a finite number ('inf')"),
    ("12,5,AA,1", "in.csv:202: expected 5 fields as the header has, found 4"),
    ("12,5,AA,JFK,2", "in.csv:202: column delayed: label must be -1, 0 or +1"),
    ('12,5,"AA,JFK,1', "in.csv:202: not a CSV row"),
])
def test_a_bad_row_is_named_with_its_line_and_nothing_is_written(tmp_path, capsys, line, message):
    text = f"{HEADER}\n" + "1,2,UA,SFO,0\n" * 200 + f"{line}\n"  # a word among 200 numbers is a bad cell
    assert prepare(tmp_path, text, "--label", "delayed") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "data" / "manifest.json").exists()
    # --on-error skip leaves the row out and counts it
    assert prepare(tmp_path, text, "--label", "delayed", "--on-error", "skip", "--validation-fraction", "0") == 0
    assert Dataset.open(str(tmp_path / "data")).manifest.n_train == 200


@pytest.mark.parametrize("args, message", [
    (["--label", "late"], "--label 'late': "),
    ([], "--format csv needs --label COL"),
    (["--label", "delayed", "--delimiter", ";;"], "--delimiter must be one character"),
])
def test_a_label_column_that_is_not_there_is_refused_in_one_line(tmp_path, capsys, args, message):
    assert prepare(tmp_path, f"{HEADER}\n1,2,UA,SFO,0\n", *args) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_validation_file_is_read_with_the_training_files_columns(tmp_path, capsys):
    # "distance" holds only numbers in the training file; a word there in the validation file is a bad row
    (tmp_path / "valid.csv").write_text(f"{HEADER}\n1,7,AA,JFK,1\n2,8,UA,,0\n")
    assert prepare(tmp_path, f"{HEADER}\n1,2,UA,SFO,0\n3,4,AA,JFK,1\n", "--label", "delayed", "--validation",
                   str(tmp_path / "valid.csv")) == 0
    ds = Dataset.open(str(tmp_path / "data"))
    assert (ds.manifest.n_train, ds.manifest.n_validation) == (2, 2)
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    assert prepare(tmp_path, f"{HEADER}\n1,2,UA,SFO,0\n", "--label", "delayed", "--validation",
                   str(tmp_path / "other.csv"), name="again.csv") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "other.csv: its header (a, b, …) is not the training file's" in err[0], err


@pytest.mark.slow
def test_linear_regression_learns_from_a_csv_at_its_defaults(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (4000, 3))
    carrier = rng.choice(["AA", "UA", "DL"], 4000)
    y = 10 + x @ [2.0, -3.0, 1.0] + np.select([carrier == "UA", carrier == "DL"], [1.5, -1.0]) + rng.normal(0, 0.1, 4000)
    lines = ["a,b,c,carrier,y", *(f"{a:.4f},{b:.4f},{c:.4f},{k},{v:.4f}" for (a, b, c), k, v in zip(x, carrier, y))]
    assert prepare(tmp_path, "\n".join(lines) + "\n", "--label", "y", "--labels", "real", "--batch-size", "200") == 0
    job = job_for(tmp_path / "data", workers=2, model={"type": "linear-regression"}, stop={"maxEpochs": 6})
    summary = train_local(job, tmp_path / "run", Services(), QUIET)
    # the features explain most of the labels' spread (σ about 1.4): well below predicting their mean
    assert summary["validation_loss"] < 0.5 * float(np.std(y)), (summary["validation_loss"], np.std(y))
