"""Warm start (`spec.model.initFrom`): a job starts from an earlier job's model, checked against its own shape."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from mlless.data.dataset import Dataset
from mlless.progress import Progress
from mlless.runtime.local import Services, train_local
from mlless.spec import from_manifest, load_manifest
from mlless.training.models import build_model, load_model
from mlless.training.warm_start import WarmStartError, initial_model

pytestmark = pytest.mark.slow

QUIET = Progress(enabled=False)


def manifest(dataset: Path, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "warm"},
            "spec": {"workers": 2, "model": {"type": "pmf"}, "dataset": {"uri": str(dataset), "cacheBatches": True},
                     **spec}}


def first_validation(run_dir: Path) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(r["validation_loss"] for r in rows if r.get("validation_loss") is not None)


# A second job that barely moves (SGD at 1e-6) and evaluates after its first step: what it evaluates is what it
# started from.
STILL = {"optimizer": {"type": "sgd", "learningRate": 1e-6}, "sync": {"protocol": "bsp"}, "stop": {"maxSteps": 2},
         "evaluation": {"everySteps": 1}}


def test_a_warm_started_job_starts_where_the_first_one_ended(movielens_dir, tmp_path):
    first = train_local(from_manifest(manifest(movielens_dir, stop={"maxEpochs": 3})), tmp_path / "first",
                        Services(), QUIET)
    assert first["started_from"] == "seed 0"
    # The run directory names the model (its model.npz), as an output.uri would.
    warm = train_local(from_manifest(manifest(movielens_dir, model={"type": "pmf", "initFrom": str(tmp_path / "first")},
                                              **STILL)), tmp_path / "warm", Services(), QUIET)
    train_local(from_manifest(manifest(movielens_dir, **STILL)), tmp_path / "cold", Services(), QUIET)
    assert warm["started_from"] == str(tmp_path / "first")
    assert first_validation(tmp_path / "warm") == pytest.approx(first["validation_loss"], abs=1e-3)
    assert first_validation(tmp_path / "cold") > first["validation_loss"] + 0.05


def test_every_replica_starts_from_the_file(movielens_dir, tmp_path):
    dataset = Dataset.open(str(movielens_dir))
    saved = build_model("pmf", dataset.dims(), seed=7)
    saved.save(tmp_path / "model.npz")
    job = from_manifest(manifest(movielens_dir, model={"type": "pmf", "initFrom": str(tmp_path / "model.npz")}))
    started = initial_model(job, dataset)
    np.testing.assert_array_equal(started.params, saved.params)
    assert not np.array_equal(build_model("pmf", dataset.dims(), seed=0).params, saved.params)


def test_a_relative_init_from_resolves_against_the_manifest(movielens_dir, tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(manifest(movielens_dir, model={"type": "pmf", "initFrom": "old/model.npz"})))
    assert load_manifest(job_file).model.init_from == str(tmp_path / "old" / "model.npz")


@pytest.mark.parametrize("other", ["type", "dims", "missing"])
def test_a_model_that_does_not_fit_is_refused_naming_the_field(movielens_dir, synthetic_lr_dir, tmp_path, other):
    dataset = Dataset.open(str(movielens_dir))
    dims = dataset.dims()
    if other == "type":
        build_model("logistic-regression", Dataset.open(str(synthetic_lr_dir)).dims()).save(tmp_path / "model.npz")
    elif other == "dims":
        build_model("pmf", {**dims, "n_items": dims["n_items"] + 1}).save(tmp_path / "model.npz")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(manifest(movielens_dir, model={"type": "pmf", "initFrom": str(tmp_path)})))
    proc = subprocess.run([sys.executable, "-m", "mlless", "train", str(job_file), "--out", str(tmp_path / "run")],
                          capture_output=True, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and "spec.model.initFrom" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "logs").exists() or not any((tmp_path / "run" / "logs").iterdir())
    with pytest.raises(WarmStartError, match="spec.model.initFrom"):
        initial_model(from_manifest(manifest(movielens_dir, model={"type": "pmf", "initFrom": str(tmp_path)})), dataset)


def test_a_saved_model_round_trips_through_a_file_object(movielens_dir, tmp_path):
    model = build_model("pmf", Dataset.open(str(movielens_dir)).dims(), seed=3)
    model.save(tmp_path / "m.npz")
    with open(tmp_path / "m.npz", "rb") as fh:
        np.testing.assert_array_equal(load_model(fh, name="m").params, model.params)
