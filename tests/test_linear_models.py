"""The linear SVM, linear regression and softmax (#23): trained by real worker processes at their defaults, on both
transports, to a quality bar each test computes from its data; real labels and classes are prepared with --labels,
and a model refuses labels it does not fit in one line."""
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


def prepared_libsvm(root: Path, rows: int, per_row: int, low: float, labels: str, label_of) -> Path:
    """`rows` libsvm rows of `per_row` of the 40 features, valued uniformly in [low, 1), each labelled
    `label_of(rng, columns, values)`, prepared with `--labels labels` in batches of 200."""
    rng = np.random.default_rng(len(labels))
    lines = []
    for _ in range(rows):
        cols = np.sort(rng.choice(len(WEIGHTS), per_row, replace=False))
        x = rng.uniform(low, 1.0, per_row)
        lines.append(f"{label_of(rng, cols, x):.4f} " + " ".join(f"{c + 1}:{v:.4f}" for c, v in zip(cols, x)))
    (root / "train.svm").write_text("\n".join(lines) + "\n")
    assert main(["prepare", "--format", "libsvm", str(root / "train.svm"), "--out", str(root / "data"),
                 "--labels", labels, "--batch-size", "200", "--quiet"]) == 0
    return root / "data"


@pytest.fixture(scope="module")
def regression_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6,000 sparse rows whose labels are 50 + w·x + noise (σ 0.5), prepared with real labels."""
    return prepared_libsvm(tmp_path_factory.mktemp("regression"), 6000, 6, 0.0, "real",
                           lambda rng, cols, x: 50.0 + WEIGHTS[cols] @ x + rng.normal(0.0, 0.5))


@pytest.mark.parametrize("services", ["embedded", "redis+rabbitmq"])
def test_linear_regression_at_its_defaults_fits_real_labels(regression_dir, tmp_path, redis_url, amqp_url, services):
    dataset = Dataset.open(str(regression_dir))
    assert dataset.labels == "real" and dataset.dims()["mean_label"] == pytest.approx(50.0 + WEIGHTS.mean() * 3, abs=1.0)
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
    assert summary["validation_scores"] == {}  # its loss metric is RMSE already


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


@pytest.fixture(scope="module")
def classes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8,000 sparse rows of 4 classes labelled 1, 2, 5 and 7 (the argmax of planted scores + noise), class 1 the
    most frequent, prepared with --labels classes."""
    scores = np.random.default_rng(13).normal(0.0, 2.0, (len(WEIGHTS), 4))
    return prepared_libsvm(tmp_path_factory.mktemp("classes"), 8000, 5, 0.5, "classes",
                           lambda rng, cols, x: (1, 2, 5, 7)[int(np.argmax(x @ scores[cols] + rng.normal(0.0, 1.0, 4)
                                                                           + [1.0, 0, 0, 0]))])


@pytest.mark.parametrize("services", ["embedded", "redis+rabbitmq"])
def test_softmax_at_its_defaults_tells_the_classes_apart(classes_dir, tmp_path, redis_url, amqp_url, services):
    dataset = Dataset.open(str(classes_dir))
    # The labels 1, 2, 5 and 7 are classes 0-3, and the manifest says which is which.
    assert dataset.labels == "classes" and dataset.dims()["classes"] == [0, 1, 2, 3]
    assert dataset.manifest.feature_stats["label_values"] == [1, 2, 5, 7]
    validation = dataset.validation()
    shares = np.array([np.mean(validation.labels == c) for c in range(4)])
    svc = Services(redis_url, amqp_url) if services != "embedded" else Services()
    job = job_for(classes_dir, workers=2, model={"type": "softmax"}, stop={"maxEpochs": 6})
    summary = train_local(job, tmp_path, svc, QUIET)
    assert summary["loss_metric"] == "cross-entropy" and summary["dropped_workers"] == []
    assert summary["rejected_frames"] == 0
    # Below the cross-entropy of predicting the classes' shares for every row, and more often right than the
    # most frequent class.
    assert summary["validation_loss"] < 0.8 * float(-(shares * np.log(shares)).sum()), (summary, shares)
    model = load_model(tmp_path / "model.npz")
    right = model.classes[model.predict(validation).argmax(axis=1)] == validation.labels
    assert float(right.mean()) > shares.max() + 0.1, (right.mean(), shares)
    assert summary["validation_scores"] == {"accuracy": pytest.approx(float(right.mean()))}


def test_a_classifier_is_refused_real_labels_in_one_line(regression_dir, tmp_path, capsys):
    manifest = tmp_path / "job.yaml"
    manifest.write_text("apiVersion: mlless.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: svm}\n"
                        f"spec: {{model: {{type: svm}}, dataset: {{uri: {regression_dir}}}}}\n")
    assert main(["train", str(manifest), "--out", str(tmp_path / "run")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"mlless: error: {manifest}: spec.model.type svm fits binary labels, and {regression_dir} holds "
                   "real labels (mlless prepare --labels)"], err


def test_softmax_is_refused_real_labels_and_too_many_classes_are_refused_by_prepare(regression_dir, tmp_path,
                                                                                        capsys):
    manifest = tmp_path / "job.yaml"
    manifest.write_text("apiVersion: mlless.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: softmax}\n"
                        f"spec: {{model: {{type: softmax}}, dataset: {{uri: {regression_dir}}}}}\n")
    assert main(["train", str(manifest), "--out", str(tmp_path / "run")]) != 0
    assert "spec.model.type softmax fits binary or classes labels" in capsys.readouterr().err
    (tmp_path / "many.svm").write_text("".join(f"{i} 1:1\n" for i in range(1001)))
    assert main(["prepare", "--format", "libsvm", str(tmp_path / "many.svm"), "--out", str(tmp_path / "data"),
                 "--labels", "classes", "--quiet"]) != 0
    assert "--labels classes: more than 1000 distinct labels" in capsys.readouterr().err


def test_binary_libsvm_labels_are_still_checked(tmp_path, capsys):
    (tmp_path / "bad.svm").write_text("1 1:0.5\n2.5 2:1\n0 3:1\n")
    main(["prepare", "--format", "libsvm", str(tmp_path / "bad.svm"), "--out", str(tmp_path / "data"), "--quiet"])
    assert "label must be -1, 0 or +1 (--labels real reads any number, --labels classes any K values)" in capsys.readouterr().err


def test_the_classifiers_figures_are_in_the_summary_and_from_mlless_evaluate(synthetic_lr_dir, tmp_path, capsys):
    """Accuracy and AUC of the handed-back model, the same in summary.json and from `mlless evaluate`, and the
    same as computed here from its margins."""
    import json

    from scipy.stats import rankdata

    summary = train_local(job_for(synthetic_lr_dir, workers=1, model={"type": "logistic-regression"},
                                  stop={"maxEpochs": 1}), tmp_path, Services(), QUIET)
    validation = Dataset.open(str(synthetic_lr_dir)).validation()
    margins = load_model(tmp_path / "model.npz").margins(validation)
    positive = validation.labels == 1
    ranks = rankdata(margins)
    auc = (ranks[positive].sum() - positive.sum() * (positive.sum() + 1) / 2) / (positive.sum() * (~positive).sum())
    assert summary["validation_scores"] == pytest.approx({"accuracy": np.mean((margins > 0) == positive), "auc": auc})
    assert 0.6 < summary["validation_scores"]["auc"] < 1
    assert main(["evaluate", str(tmp_path / "model.npz"), str(synthetic_lr_dir)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["validation_accuracy"] == pytest.approx(summary["validation_scores"]["accuracy"])
    assert shown["validation_auc"] == pytest.approx(summary["validation_scores"]["auc"])
    assert shown["validation"] == pytest.approx(summary["validation_loss"])


@pytest.mark.parametrize("values", [[3.0], [1.0, 1.0], [2.0, 1.0, 2.0, 0.5, 2.0], list(np.arange(50) % 7)])
def test_average_ranks_match_scipy_with_ties(values):
    """The AUC's ranks, computed without importing scipy.stats (1-2 s of a worker's start), are scipy's."""
    from scipy.stats import rankdata

    from mlless.training.models.base import _average_ranks

    assert _average_ranks(np.asarray(values, np.float64)).tolist() == rankdata(values).tolist()
