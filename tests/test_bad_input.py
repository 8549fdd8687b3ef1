"""Bad input from a user gets one clear line naming the field or file, and exit code 2: no traceback, no inf."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

import pytest

from mlless.cli import main
from mlless.spec.config import ModelConfig
from mlless.training.models import build_model

MANIFEST = """apiVersion: mlless.io/v1alpha1
kind: TrainingJob
metadata: {{name: bad}}
spec:
  model: {{type: {model}}}
  dataset: {{uri: {data}}}
{extra}"""


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def manifest(tmp_path: Path, data: Path, model: str = "pmf", extra: str = "") -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(MANIFEST.format(model=model, data=data, extra=extra))
    return path


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_a_number_yaml_has_and_json_has_not_is_refused_by_name(tmp_path, movielens_dir, capsys, value):
    job = manifest(tmp_path, movielens_dir, extra=f"  optimizer: {{learningRate: {value}}}\n")
    code, err = run(capsys, "validate", str(job))
    assert code == 2 and "spec.optimizer.learningRate" in err and "not a finite number" in err


def test_a_price_whose_cost_would_overflow_is_refused_by_name(tmp_path, movielens_dir, capsys):
    """Issue #22: pricePerGBSecond 1e300 made the cost infinite, and the run crashed writing it."""
    job = manifest(tmp_path, movielens_dir, extra="  pricing: {pricePerGBSecond: 1.0e+300}\n")
    code, err = run(capsys, "validate", str(job))
    assert code == 2 and "spec.pricing.pricePerGBSecond" in err


BOMB = "".join(f"x{k}: &x{k} [{', '.join([f'*x{k - 1}'] * 9) if k else '1'}]\n" for k in range(9))


@pytest.mark.parametrize("extra, says", [
    (BOMB, "more than 32 aliases"),  # 9^8 elements once expanded: validate used to hang walking them
    ("  model: {type: logistic-regression}\n", "key 'model' given twice"),
    ("owner: someone\n", "'owner' was unexpected"),
    ("  stop: {maxSteps: 100000000000000000000000000}\n", "spec.stop.maxSteps"),
])
def test_manifests_that_yaml_would_accept_are_refused_in_one_line(tmp_path, movielens_dir, capsys, extra, says):
    job = manifest(tmp_path, movielens_dir, extra=extra)
    code, err = run(capsys, "validate", str(job))
    assert code == 2 and says in err and "job.yaml" in err


def test_a_manifest_that_is_not_utf8_is_named(tmp_path, movielens_dir, capsys):
    job = tmp_path / "job.yaml"
    job.write_bytes(MANIFEST.format(model="pmf", data=movielens_dir, extra="").encode().replace(b"name: bad", b"name: b\xffd"))
    code, err = run(capsys, "validate", str(job))
    assert code == 2 and "job.yaml" in err and "UTF-8" in err


def test_a_model_on_the_other_kind_of_dataset_is_refused_before_anything_starts(tmp_path, movielens_dir, capsys):
    job = manifest(tmp_path, movielens_dir, model="logistic-regression")
    code, err = run(capsys, "train", str(job), "--out", str(tmp_path / "run"), "-q")
    assert code == 2 and "spec.model.type logistic-regression" in err and "ratings" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("files", ["train/batch-*.npz", "users/shard-*.npz"])
def test_a_corrupt_batch_is_found_before_the_first_step(tmp_path, movielens_dir, capsys, files):
    """Issue #22: a corrupt batch was found only when first read, up to 23 steps into a job. A user shard (read
    only under blocked, at P >= 2) is checked the same way."""
    data = tmp_path / "data"
    shutil.copytree(movielens_dir, data)
    last = sorted(data.glob(files))[-1]
    raw = bytearray(last.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    last.write_bytes(bytes(raw))
    job = manifest(tmp_path, data, extra="  workers: 1\n  stop: {maxSteps: 5}\n")
    code, err = run(capsys, "train", str(job), "--out", str(tmp_path / "run"), "-q")
    assert code == 2 and f"{last.name}: sha256" in err and "does not match the manifest" in err
    assert not (tmp_path / "run" / "summary.json").exists()
    shutil.rmtree(data)  # the data fixed: the run directory holds nothing to resume, so the same command runs again
    shutil.copytree(movielens_dir, data)
    code, err = run(capsys, "train", str(job), "--out", str(tmp_path / "run"), "-q")
    assert code == 0, err


def test_evaluate_refuses_what_is_not_a_model_and_a_model_of_other_dimensions(tmp_path, movielens_dir, capsys):
    text = tmp_path / "notes.npz"
    text.write_text("not a model")
    code, err = run(capsys, "evaluate", str(text), str(movielens_dir))
    assert code == 2 and "notes.npz: not a model file" in err

    dims = json.loads((movielens_dir / "manifest.json").read_text())
    other = build_model("pmf", {"n_users": dims["n_users"] + 1, "n_items": dims["n_items"], "mean_rating": 3.0},
                        ModelConfig("pmf"))
    other.save(tmp_path / "other.npz", {})
    code, err = run(capsys, "evaluate", str(tmp_path / "other.npz"), str(movielens_dir))
    assert code == 2 and "n_users" in err and "other.npz" in err

    # A few bytes whose metadata claims 10^12 users: refused before a model of that size is allocated.
    meta = {"kind": "pmf", "rank": 2, "dims": {"n_users": 10**12, "n_items": 5, "mean_rating": 3.0}, "version": 1}
    with open(tmp_path / "huge.npz", "wb") as fh:
        np.savez(fh, params=np.zeros(10, np.float32), metadata=np.array(json.dumps(meta)))
    code, err = run(capsys, "evaluate", str(tmp_path / "huge.npz"), str(movielens_dir))
    assert code == 2 and "huge.npz" in err and "n_users 1000000000000 is more than the file's 10 parameters" in err


def test_prepare_refuses_a_rating_float32_cannot_hold(tmp_path, capsys):
    source = tmp_path / "ratings.csv"
    source.write_text("user,item,rating\n1,2,3\n2,3,1e300\n3,1,4\n")
    code, err = run(capsys, "prepare", str(source), "--format", "movielens", "--out", str(tmp_path / "out"))
    assert code != 0 and "ratings.csv:3" in err and "1e300" in err
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_reader_that_goes_away_gets_no_traceback():
    """`mlless validate job.yaml | head -1`: stdout's reader closes the pipe before the job is printed."""
    import subprocess
    import sys

    reader = subprocess.Popen(["true"], stdin=subprocess.PIPE)
    reader.wait()  # the pipe's only reader is gone
    done = subprocess.run([sys.executable, "-m", "mlless.cli", "validate", "examples/movielens.yaml"],
                          stdout=reader.stdin, stderr=subprocess.PIPE, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=60)
    reader.stdin.close()
    assert "Traceback" not in done.stderr and done.returncode == 1, done.stderr
