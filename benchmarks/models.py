#!/usr/bin/env python
"""The models of issue #23 against their single-machine peers: quality and seconds, in one run, on this machine.

Every system trains on the same prepared train/validation split (`mlless prepare --synthetic ...`):

  * svm on the clicks (binary labels): scikit-learn `LinearSVC` (C=1) and `SGDClassifier(loss="hinge")` (5
    epochs of `partial_fit` on the same batches), VW `--loss_function hinge`;
  * linear-regression on the clicks with real labels: scikit-learn `Ridge` (alpha 1) and `SGDRegressor` (5 epochs
    of `partial_fit`), VW with its default squared loss;
  * softmax on the clicks with 4 classes: scikit-learn `LogisticRegression` (lbfgs, multinomial, C=1) and VW
    `--oaa 4`;
  * logistic-regression on the dense Higgs-like set: scikit-learn `LogisticRegression` (lbfgs, C=1) and VW
    `--loss_function logistic`;
  * kmeans on Gaussian blobs (8 of unequal sizes and spreads, 16 features): scikit-learn `KMeans` and
    `MiniBatchKMeans` at their defaults (k = 8, k-means++), no VW. Quality: the mean squared distance of the
    training rows to their nearest centroid (inertia / rows, the objective all three minimise), and its ratio to
    KMeans's.

VW runs one pass with its defaults (adaptive, normalised, invariant updates, `-b 18`), parsing its text file
included. mlless runs `mlless train` with only `model.type` (and P, on the embedded broker; `--optimizer` names
another) for at most `--epochs` epochs; its quality is its saved model's on the validation split, its time the job's wall time.
Quality: accuracy for the classifiers, validation RMSE for regression, training inertia / rows for k-means. A run
of a subset of `--cases` writes a RESULTS.md section of its own.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

from mlless.data.dataset import Dataset  # noqa: E402
from mlless.training.models import load_model  # noqa: E402

#: Each case: (mlless model, `mlless prepare --synthetic` name, the quality's name).
CASES = {
    "svm": ("svm", "lr", "accuracy"),
    "linear-regression": ("linear-regression", "regression", "rmse"),
    "softmax": ("softmax", "multiclass", "accuracy"),
    "dense-lr": ("logistic-regression", "higgs", "accuracy"),
    "kmeans": ("kmeans", "blobs", "inertia"),
}


def split(ds: Dataset):
    """The training rows as one CSR matrix and labels, and the validation batch."""
    import scipy.sparse as sp

    batches = [ds.batch(i) for i in range(ds.n_batches)]
    n = ds.manifest.n_features
    X = sp.vstack([sp.csr_matrix((b.values, b.indices, b.indptr), shape=(len(b.labels), n)) for b in batches]).tocsr()
    val = ds.validation()
    Xv = sp.csr_matrix((val.values, val.indices, val.indptr), shape=(len(val.labels), n))
    return batches, X, np.concatenate([b.labels for b in batches]), Xv, val


def quality(metric: str, predicted: np.ndarray, labels: np.ndarray) -> float:
    if metric == "rmse":
        return float(np.sqrt(np.mean((predicted.astype(np.float64) - labels) ** 2)))
    return float(np.mean(predicted == labels))


def timed(fit: Callable[[], object]) -> tuple[object, float]:
    started = time.perf_counter()
    out = fit()
    return out, time.perf_counter() - started


def sklearn_peers(case: str, batches, X, y, Xv) -> list[tuple[str, np.ndarray, float]]:
    """(name, validation predictions, seconds) of each scikit-learn peer of `case`."""
    from sklearn.linear_model import LogisticRegression, Ridge, SGDClassifier, SGDRegressor
    from sklearn.svm import LinearSVC
    import scipy.sparse as sp

    def epochs(model, **kw):
        for _ in range(5):
            for b in batches:
                model.partial_fit(sp.csr_matrix((b.values, b.indices, b.indptr), shape=(len(b.labels), X.shape[1])),
                                  b.labels, **kw)
        return model

    fits = {
        "svm": [("sklearn LinearSVC", lambda: LinearSVC(C=1.0).fit(X, y)),
                ("sklearn SGDClassifier(hinge), 5 epochs", lambda: epochs(SGDClassifier(loss="hinge", random_state=0),
                                                                         classes=np.array([0.0, 1.0])))],
        "linear-regression": [("sklearn Ridge", lambda: Ridge(alpha=1.0).fit(X, y)),
                              ("sklearn SGDRegressor, 5 epochs", lambda: epochs(SGDRegressor(random_state=0)))],
        "softmax": [("sklearn LogisticRegression (multinomial)", lambda: LogisticRegression(max_iter=300).fit(X, y))],
        "dense-lr": [("sklearn LogisticRegression", lambda: LogisticRegression(max_iter=300).fit(X, y))],
    }[case]
    out = []
    for name, fit in fits:
        model, seconds = timed(fit)
        out.append((name, model.predict(Xv), seconds))
    return out


def vw_peer(case: str, batches, val, classes: np.ndarray, work: Path) -> tuple[str, np.ndarray, float]:
    """Vowpal Wabbit, one pass at its defaults with the loss of `case`."""
    from vowpalwabbit import pyvw

    if case == "softmax":
        label, options, name = (lambda v: str(int(np.searchsorted(classes, v)) + 1)), f"--oaa {len(classes)}", "--oaa"
    elif case == "linear-regression":
        label, options, name = (lambda v: f"{v:.6g}"), "", "squared"
    else:
        label, options = _common.binary_label, "--loss_function hinge" if case == "svm" else "--loss_function logistic"
        name = options.split()[-1]
    train = _common.vw_file(batches, work / f"{case}-train.vw", label)
    valid = _common.vw_file([val], work / f"{case}-validation.vw", label)
    model = work / f"{case}.vw-model"
    _, seconds = timed(lambda: (vw := pyvw.Workspace(f"--data {train} {options} -b 18 --quiet -f {model}"),
                                vw.run_parser(), vw.finish()))
    test = pyvw.Workspace(f"-t -i {model} --quiet")
    raw = np.array([test.predict(line) for line in valid.read_text().splitlines()], np.float64)
    test.finish()
    if case == "softmax":
        predicted = classes[raw.astype(int) - 1]
    elif case == "linear-regression":
        predicted = raw
    else:
        predicted = (raw > 0).astype(np.float32)  # a margin (hinge) or a logit: positive is class 1
    return f"Vowpal Wabbit {name}, 1 pass", predicted, seconds


def mlless_run(model_type: str, data: Path, workers: int, epochs: float, work: Path,
               optimizer: dict | None) -> tuple[object, float, dict]:
    job = work / f"{model_type}-{workers}.yaml"
    spec = {"workers": workers, "model": {"type": model_type}, "dataset": {"uri": str(data)},
            "stop": {"maxEpochs": epochs}} | ({"optimizer": optimizer} if optimizer else {})
    job.write_text(yaml.safe_dump({"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob",
                                   "metadata": {"name": f"{model_type}-{workers}"}, "spec": spec}))
    run = work / f"run-{model_type}-{workers}"
    started = time.perf_counter()
    _common.mlless_train(job, run, services=False)
    seconds = time.perf_counter() - started
    return load_model(run / "model.npz"), seconds, json.loads((run / "summary.json").read_text())


def mean_inertia(centres: np.ndarray, X) -> float:
    """The mean squared distance of the rows of `X` to their nearest of `centres`."""
    from mlless.training.models.kmeans import squared_distances

    return float(squared_distances(X, centres).min(axis=1).mean())


def kmeans_rows(data: Path, X, workers: list[int], epochs: float, work: Path) -> list[tuple[str, float, float]]:
    """(system, seconds, training inertia / rows) of mlless at each P and scikit-learn's KMeans and MiniBatchKMeans,
    each with its inertia's ratio to KMeans's in the name."""
    from sklearn.cluster import KMeans, MiniBatchKMeans

    rows = []
    for p in workers:
        model, seconds, summary = mlless_run("kmeans", data, p, epochs, work, None)
        rows.append((f"mlless kmeans, P = {p}, {summary['epochs']:.2f} epochs", seconds, mean_inertia(model.centroids, X)))
        print(rows[-1], flush=True)
    for name, fit in [("sklearn KMeans", lambda: KMeans(8, random_state=0).fit(X)),
                      ("sklearn MiniBatchKMeans", lambda: MiniBatchKMeans(8, random_state=0).fit(X))]:
        peer, seconds = timed(fit)
        rows.append((name, seconds, mean_inertia(peer.cluster_centers_, X)))
        print(rows[-1], flush=True)
    reference = rows[len(workers)][2]
    return [(f"{name} ({value / reference:.4f} x KMeans)", seconds, value) for name, seconds, value in rows]


def mlless_predictions(model, metric: str, val) -> np.ndarray:
    out = model.predict(val)
    if metric == "rmse":
        return out
    if out.ndim == 2:  # softmax: class probabilities
        return model.classes[out.argmax(axis=1)]
    return (out > (0.5 if model.kind == "logistic-regression" else 0.0)).astype(np.float32)


def labelled_rows(case: str, data: Path, parts: tuple, args: argparse.Namespace,
                  optimizer: dict | None) -> list[tuple[str, float, float]]:
    """(system, seconds, quality on the validation split) of mlless at each P and the peers of `case`, on the
    data set's `split`."""
    model_type, _, metric = CASES[case]
    batches, X, y, Xv, val = parts
    classes = np.unique(np.concatenate([y, val.labels]))
    rows = []
    for workers in args.workers:
        model, seconds, summary = mlless_run(model_type, data, workers, args.epochs, args.data_dir, optimizer)
        rows.append((f"mlless {model_type}{f' ({args.optimizer})' if optimizer else ''}, P = {workers}, "
                     f"{summary['epochs']:.2f} epochs", seconds,
                     quality(metric, mlless_predictions(model, metric, val), val.labels)))
        print(rows[-1], flush=True)
    for name, predicted, seconds in [*sklearn_peers(case, batches, X, y, Xv),
                                     vw_peer(case, batches, val, classes, args.data_dir)]:
        rows.append((name, seconds, quality(metric, predicted, val.labels)))
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="rows of each synthetic set (default 200,000)")
    parser.add_argument("--epochs", type=float, default=3.0, help="mlless's epoch limit (default 3)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="mlless's P values (default 1 2)")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/mlless-bench"))
    parser.add_argument("--optimizer", metavar="TYPE:LR", default=None,
                        help="train mlless with this optimizer (e.g. normalized:0.5) instead of the model's default")
    parser.add_argument("--no-results", action="store_true", help="do not update RESULTS.md")
    args = parser.parse_args()
    optimizer = None
    if args.optimizer:
        kind, rate = args.optimizer.split(":")
        optimizer = {"type": kind, "learningRate": float(rate)}
    info = _common.machine_info()
    sections = [f"Machine: {_common.machine_line(info)}.", f"Command: `{_common.command_line()}`."]
    for case in args.cases:
        _, synthetic, metric = CASES[case]
        data = _common.prepare(args.data_dir / f"models-{synthetic}-{args.rows}", "--synthetic", synthetic,
                               "--rows", str(args.rows))
        parts = split(Dataset.open(str(data)))
        if case == "kmeans":
            rows = kmeans_rows(data, parts[1], args.workers, args.epochs, args.data_dir)
        else:
            rows = labelled_rows(case, data, parts, args, optimizer)
        sections.append(f"### {case}: `mlless prepare --synthetic {synthetic} --rows {args.rows}`, "
                        f"{parts[1].shape[0]:,} training rows\n\n" + _common.table(["system", "seconds", metric], rows))
    body = "\n\n".join(sections)
    print(body)
    if not args.no_results:
        whole = set(args.cases) == set(CASES)
        _common.update_results("models" if whole else "models-" + "-".join(args.cases),
                               f"## {'The models' if whole else ', '.join(args.cases)} of #23 against their peers "
                               "(`benchmarks/models.py`)\n\n" + body)


if __name__ == "__main__":
    main()
