"""The linear SVM and linear regression (#23): trained by real worker processes at their defaults, on both
transports, to a quality bar each test computes from its data; real labels are prepared with --labels real and
refused to a classifier in one line."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mlless.cli import main
from mlless.data.dataset import Dataset
from mlless.runtime.local import Services, train_local
from mlless.training.models import load_model

from test_training import QUIET, job_for

pytestmark = pytest.mark.slow

WEIGHTS = np.random.default_rng(11).normal(0.0, 1.5, 40)


@pytest.fixture(scope="module")
def regression_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A libsvm file of 6,000 sparse rows whose labels are 50 + w·x + noise (σ 0.5), prepared with real labels."""
    root = tmp_path_factory.mktemp("regression")
    rng = np.random.default_rng(12)
    lines = []
    for _ in range(6000):
        cols = np.sort(rng.choice(len(WEIGHTS), 6, replace=False))
        x = rng.uniform(0.0, 1.0, 6)
        y = 50.0 + WEIGHTS[cols] @ x + rng.normal(0.0, 0.5)
        lines.append(f"{y:.4f} " + " ".join(f"{c + 1}:{v:.4f}" for c, v in zip(cols, x)))
    (root / "train.svm").write_text("\n".join(lines) + "\n")
    assert main(["prepare", "--format", "libsvm", str(root / "train.svm"), "--out", str(root / "data"),
                 "--labels", "real", "--batch-size", "200", "--quiet"]) == 0
    return root / "data"


@pytest.mark.parametrize("services", ["embedded", "redis+rabbitmq"])
def test_linear_regression_at_its_defaults_fits_real_labels(regression_dir, tmp_path, redis_url, amqp_url, services):
    dataset = Dataset.open(str(regression_dir))
    assert dataset.real_labels and dataset.dims()["mean_label"] == pytest.approx(50.0 + WEIGHTS.mean() * 3, abs=1.0)
    labels = dataset.validation().labels
    mean_only = float(np.sqrt(np.mean((labels - dataset.dims()["mean_label"]) ** 2)))
    svc = Services(redis_url, amqp_url) if services != "embedded" else Services()
    job = job_for(regression_dir, workers=2, model={"type": "linear-regression"}, stop={"maxEpochs": 6})
    summary = train_local(job, tmp_path, svc, QUIET)
    assert summary["loss_metric"] == "rmse" and summary["dropped_workers"] == [] and summary["rejected_frames"] == 0
    # The features explain most of the labels' spread: well below predicting their mean, towards the noise's 0.5.
    assert summary["validation_loss"] < 0.5 * mean_only, (summary["validation_loss"], mean_only)
    model = load_model(tmp_path / "model.npz")
    assert model.kind == "linear-regression" and abs(float(model.b[0]) - 50.0) < 5.0


@pytest.mark.parametrize("services", ["embedded", "redis+rabbitmq"])
def test_the_svm_at_its_defaults_separates_the_clicks(synthetic_lr_dir, tmp_path, redis_url, amqp_url, services):
    svc = Services(redis_url, amqp_url) if services != "embedded" else Services()
    job = job_for(synthetic_lr_dir, workers=2, model={"type": "svm"}, stop={"maxEpochs": 3})
    summary = train_local(job, tmp_path, svc, QUIET)
    assert summary["loss_metric"] == "hinge" and summary["dropped_workers"] == [] and summary["rejected_frames"] == 0
    validation = Dataset.open(str(synthetic_lr_dir)).validation()
    # A constant margin c scores mean(max(0, 1 - s·c)) at best over c in [-1, 1]: 2·min(p, 1 - p) for a base rate p.
    p = float(validation.labels.mean())
    assert summary["validation_loss"] < 0.95 * 2 * min(p, 1 - p), (summary["validation_loss"], p)
    margins = load_model(tmp_path / "model.npz").predict(validation)
    accuracy = float(np.mean((margins > 0) == (validation.labels == 1)))
    assert accuracy > max(p, 1 - p) + 0.02, (accuracy, p)


def test_a_classifier_is_refused_real_labels_in_one_line(regression_dir, tmp_path, capsys):
    manifest = tmp_path / "job.yaml"
    manifest.write_text("apiVersion: mlless.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: svm}\n"
                        f"spec: {{model: {{type: svm}}, dataset: {{uri: {regression_dir}}}}}\n")
    assert main(["train", str(manifest), "--out", str(tmp_path / "run")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"mlless: error: {manifest}: spec.model.type svm needs labels 0/1, and {regression_dir} holds real ones "
                   "(prepared with --labels real)"], err


def test_binary_libsvm_labels_are_still_checked(tmp_path, capsys):
    (tmp_path / "bad.svm").write_text("1 1:0.5\n2.5 2:1\n0 3:1\n")
    main(["prepare", "--format", "libsvm", str(tmp_path / "bad.svm"), "--out", str(tmp_path / "data"), "--quiet"])
    assert "label must be -1, 0 or +1 (--labels real reads any number)" in capsys.readouterr().err
