"""The peers mlless is measured against, each run the one way every suite runs it, on the split mlless trains on.

PMF (validation RMSE; rank 20 everywhere):
  * LIBMF (PyPI `libmf`), L2 0.05 on P and Q, no L1 (the binding's default L1 zeroes every factor); fitted on
    ratings minus their mean, one fit per iteration count, timed whole (its setup included). Predictions come from
    its P and Q: the binding's `predict` returns garbage.
  * scikit-surprise `SVD` (its defaults: lr 0.005, reg 0.02, init std 0.1), one fit per epoch count.
  * PyTorch: biased MF with sparse embeddings and `SparseAdam` (lr 0.01, batch 1024), as its docs show sparse
    embeddings trained; torch threads = the machine's cores; one evaluation per epoch. Optional: without torch its
    curve is empty, with the note "not installed". (PyTorch DDP at equal P: `_ddp.py`.)
LR (validation BCE):
  * Vowpal Wabbit (PyPI `vowpalwabbit`): `--loss_function logistic --link logistic -b 18` (its defaults: adaptive,
    normalised, invariant updates, lr 0.5), one pass over a text file in VW's format, parsing included.
  * scikit-learn: `SGDClassifier(loss="log_loss")` `partial_fit` on the same CSR batches, and `LogisticRegression`
    (lbfgs, C=1) on the whole CSR matrix.
The models of issue #23 (`model_peers`, `split`): svm, `LinearSVC` (C=1) and `SGDClassifier(loss="hinge")` (5 epochs of
`partial_fit`), VW `--loss_function hinge`; linear-regression, `Ridge` (alpha 1) and `SGDRegressor` (5 epochs), VW's
squared loss; softmax, `LogisticRegression` (lbfgs, multinomial) and VW `--oaa K`; dense LR, `LogisticRegression`
and VW logistic; k-means, `KMeans` and `MiniBatchKMeans` at their defaults (k = 8, k-means++), scored by the training
rows' inertia / rows.

Targets, the anchor's converged quality plus a margin (`pmf_target`, `lr_target`): Surprise's 20-epoch RMSE on the
MovieLens sample, LIBMF's 10-iteration RMSE (2 threads) + 0.01 on the synthetic ratings, VW's one-pass BCE + 0.005.
"""
from __future__ import annotations

import contextlib
import io
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import _common
from ._common import Curve, all_batches, bce, ratings, rmse

RANK = 20
CORES = os.cpu_count() or 1


# ---- PMF ------------------------------------------------------------------------------------------------------------

def run_libmf(ds: Any, threads: int, iters: int) -> Curve:
    with contextlib.redirect_stdout(io.StringIO()):  # the binding prints where it found its .so
        from libmf import mf
    u, i, r = ratings(ds)
    val = ds.validation()
    mean = float(r.mean())
    X = np.ascontiguousarray(np.stack([u, i, r - mean], 1).astype(np.float32))
    lo, hi = ds.manifest.rating_min, ds.manifest.rating_max
    curve = Curve(f"LIBMF, {threads} thread{'s' * (threads > 1)}")
    for n in range(1, iters + 1):
        model = mf.MF(k=RANK, nr_threads=threads, nr_iters=n, lambda_p1=0.0, lambda_q1=0.0,
                      lambda_p2=0.05, lambda_q2=0.05, quiet=True)
        started = time.perf_counter()
        model.fit(X)
        seconds = time.perf_counter() - started
        P, Q = model.p_factors(), model.q_factors()
        known = (val.users < len(P)) & (val.items < len(Q))
        pred = np.full(len(val), mean, np.float32)
        pred[known] += np.einsum("ij,ij->i", P[val.users[known]], Q[val.items[known]])
        curve.add(seconds, n, rmse(pred, val.ratings, lo, hi))
    return curve


def run_surprise(ds: Any, epochs: list[int]) -> Curve:
    import pandas as pd
    from surprise import SVD, Dataset as SDataset, Reader

    u, i, r = ratings(ds)
    val = ds.validation()
    lo, hi = ds.manifest.rating_min, ds.manifest.rating_max
    data = SDataset.load_from_df(pd.DataFrame({"u": u, "i": i, "r": r}), Reader(rating_scale=(lo, hi)))
    trainset = data.build_full_trainset()
    curve = Curve("Surprise SVD")
    for n in epochs:
        algo = SVD(n_factors=RANK, n_epochs=n, random_state=0)
        started = time.perf_counter()
        algo.fit(trainset)
        seconds = time.perf_counter() - started
        pred = np.array([algo.predict(a, b).est for a, b in zip(val.users, val.items)], np.float32)
        curve.add(seconds, n, rmse(pred, val.ratings, lo, hi))
    return curve


def run_torch(ds: Any, epochs: int, max_seconds: float) -> Curve:
    try:
        import torch
    except ImportError:  # an optional peer: the other rows do not need it
        print("    PyTorch is not installed: its row is left empty", flush=True)
        return Curve("PyTorch SparseAdam", note="not installed")

    torch.set_num_threads(CORES)
    torch.manual_seed(0)
    u, i, r = (torch.from_numpy(np.asarray(a, np.int64 if k < 2 else np.float32)) for k, a in enumerate(ratings(ds)))
    val = ds.validation()
    vu, vi = torch.from_numpy(val.users.astype(np.int64)), torch.from_numpy(val.items.astype(np.int64))
    nu, ni = ds.manifest.n_users, ds.manifest.n_items
    mean = float(r.mean())
    P, Q = torch.nn.Embedding(nu, RANK, sparse=True), torch.nn.Embedding(ni, RANK, sparse=True)
    bu, bi = torch.nn.Embedding(nu, 1, sparse=True), torch.nn.Embedding(ni, 1, sparse=True)
    for emb in (P, Q):
        torch.nn.init.normal_(emb.weight, 0, 0.1)
    for emb in (bu, bi):
        torch.nn.init.zeros_(emb.weight)
    params = [*P.parameters(), *Q.parameters(), *bu.parameters(), *bi.parameters()]
    opt = torch.optim.SparseAdam(params, lr=0.01)
    lo, hi = ds.manifest.rating_min, ds.manifest.rating_max

    def predict(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (P(a) * Q(b)).sum(1) + bu(a).squeeze(1) + bi(b).squeeze(1) + mean

    curve = Curve(f"PyTorch SparseAdam, {CORES} threads")
    seconds = 0.0
    for epoch in range(1, epochs + 1):
        started = time.perf_counter()
        for part in torch.randperm(len(r)).split(1024):
            opt.zero_grad()
            loss = torch.mean((predict(u[part], i[part]) - r[part]) ** 2)
            loss.backward()
            opt.step()
        seconds += time.perf_counter() - started
        with torch.no_grad():
            curve.add(seconds, epoch, rmse(predict(vu, vi).numpy(), val.ratings, lo, hi))
        if seconds > max_seconds:
            curve.note = f"stopped after {max_seconds:g} s"
            break
    return curve


def pmf_target(key: str, ds: Any, libmf2: Curve | None = None, surprise: Curve | None = None) -> tuple[Curve, float]:
    """The anchor run and target validation RMSE of PMF set `key`: Surprise's 20-epoch RMSE on the MovieLens sample,
    LIBMF's 10-iteration RMSE (2 threads) + 0.01 on the synthetic ratings. The anchor is run unless it is given."""
    if key == "movielens":
        anchor = surprise or run_surprise(ds, [20])
        return anchor, anchor.points[-1][2]
    anchor = libmf2 or run_libmf(ds, 2, 10)
    return anchor, anchor.points[-1][2] + 0.01


# ---- LR -------------------------------------------------------------------------------------------------------------

def binary_label(y: float) -> str:
    """A 0/1 label as Vowpal Wabbit's -1/+1."""
    return "1" if y > 0.5 else "-1"


def vw_file(batches: list, path: Path, label: Callable[[float], str] = binary_label) -> Path:
    """The rows in Vowpal Wabbit's text format (written once; VW's documented input), each label written by `label`."""
    if path.exists():
        return path
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        for b in batches:
            for row in range(len(b.labels)):
                lo, hi = b.indptr[row], b.indptr[row + 1]
                feats = " ".join(f"{j}:{v:.6g}" for j, v in zip(b.indices[lo:hi].tolist(), b.values[lo:hi].tolist()))
                fh.write(f"{label(float(b.labels[row]))} | {feats}\n")
    tmp.rename(path)
    return path


def vw_predict(model: Path, rows: Path, options: str = "") -> np.ndarray:
    """VW's predictions of a saved model on a text file's rows."""
    from vowpalwabbit import pyvw

    test = pyvw.Workspace(f"-t -i {model} --quiet {options}")
    out = np.array([test.predict(line) for line in rows.read_text().splitlines()], np.float64)
    test.finish()
    return out


def vw_fit(train: Path, model: Path, options: str) -> float:
    """Seconds of one VW pass over `train` (parsing included) with `options`, the model saved at `model`."""
    from vowpalwabbit import pyvw

    started = time.perf_counter()
    vw = pyvw.Workspace(f"--data {train} {options} -b 18 --quiet -f {model}")
    vw.run_parser()
    vw.finish()
    return time.perf_counter() - started


def run_vw(ds: Any, work: Path) -> Curve:
    """VW's one logistic pass; its files go in `work`."""
    work.mkdir(parents=True, exist_ok=True)
    val = ds.validation()
    train, valid = vw_file(all_batches(ds), work / "train.vw"), vw_file([val], work / "validation.vw")
    seconds = vw_fit(train, work / "vw.model", "--loss_function logistic --link logistic")
    curve = Curve("Vowpal Wabbit, 1 pass")
    curve.add(seconds, 1, bce(vw_predict(work / "vw.model", valid, "--link logistic"), val.labels))
    return curve


def lr_target(ds: Any, work: Path, vw: Curve | None = None) -> tuple[Curve, float]:
    """The anchor run and target validation BCE of an LR set: Vowpal Wabbit's one-pass BCE + 0.005 (run unless given)."""
    anchor = vw or run_vw(ds, work)
    return anchor, anchor.points[0][2] + 0.005


def csr(batches: list, n_features: int) -> list:
    import scipy.sparse as sp

    return [sp.csr_matrix((b.values, b.indices, b.indptr), shape=(len(b.labels), n_features)) for b in batches]


def run_sgd_classifier(ds: Any, epochs: int) -> Curve:
    from sklearn.linear_model import SGDClassifier

    batches = all_batches(ds)
    n = ds.manifest.n_features
    X = csr(batches, n)
    val = ds.validation()
    Xv = csr([val], n)[0]
    clf = SGDClassifier(loss="log_loss", random_state=0)
    curve = Curve("sklearn SGDClassifier.partial_fit")
    seconds = 0.0
    for epoch in range(1, epochs + 1):
        started = time.perf_counter()
        for x, b in zip(X, batches):
            clf.partial_fit(x, b.labels, classes=np.array([0.0, 1.0]))
        seconds += time.perf_counter() - started
        curve.add(seconds, epoch, bce(clf.predict_proba(Xv)[:, 1], val.labels))
    return curve


def run_logistic_regression(ds: Any, max_iter: int) -> Curve:
    import scipy.sparse as sp
    from sklearn.linear_model import LogisticRegression

    batches = all_batches(ds)
    n = ds.manifest.n_features
    X = sp.vstack(csr(batches, n)).tocsr()
    y = np.concatenate([b.labels for b in batches])
    val = ds.validation()
    clf = LogisticRegression(max_iter=max_iter)
    started = time.perf_counter()
    clf.fit(X, y)
    seconds = time.perf_counter() - started
    curve = Curve(f"sklearn LogisticRegression (lbfgs, max_iter {max_iter})")
    curve.add(seconds, float(clf.n_iter_[0]), bce(clf.predict_proba(csr([val], n)[0])[:, 1], val.labels))
    curve.note = "epochs column: lbfgs iterations"
    return curve


# ---- the models of issue #23 ------------------------------------------------------------------------------------------

def split(ds: Any) -> tuple:
    """The training batches, the training rows as one CSR matrix and labels, and the validation rows and batch."""
    import scipy.sparse as sp

    batches = all_batches(ds)
    n = ds.manifest.n_features
    X = sp.vstack(csr(batches, n)).tocsr()
    val = ds.validation()
    return batches, X, np.concatenate([b.labels for b in batches]), csr([val], n)[0], val


def mean_inertia(centres: np.ndarray, X: Any) -> float:
    """The mean squared distance of the rows of `X` to their nearest of `centres`."""
    from mlless.training.models.kmeans import squared_distances

    return float(squared_distances(X, centres).min(axis=1).mean())


def quality(metric: str, predicted: np.ndarray, labels: np.ndarray) -> float:
    if metric == "rmse":
        return float(np.sqrt(np.mean((predicted.astype(np.float64) - labels) ** 2)))
    return float(np.mean(predicted == labels))


def timed(fit: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    out = fit()
    return out, time.perf_counter() - started


def sklearn_peers(case: str, batches: list, X: Any, y: np.ndarray, Xv: Any) -> list[tuple[str, np.ndarray, float]]:
    """(name, validation predictions, seconds) of each scikit-learn peer of `case`."""
    from sklearn.linear_model import LogisticRegression, Ridge, SGDClassifier, SGDRegressor
    from sklearn.svm import LinearSVC

    def epochs(model: Any, **kw: Any) -> Any:
        for _ in range(5):
            for b in batches:
                model.partial_fit(csr([b], X.shape[1])[0], b.labels, **kw)
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


def vw_peer(case: str, batches: list, val: Any, classes: np.ndarray, work: Path) -> tuple[str, np.ndarray, float]:
    """Vowpal Wabbit, one pass at its defaults with the loss of `case`."""
    if case == "softmax":
        label, options, name = (lambda v: str(int(np.searchsorted(classes, v)) + 1)), f"--oaa {len(classes)}", "--oaa"
    elif case == "linear-regression":
        label, options, name = (lambda v: f"{v:.6g}"), "", "squared"
    else:
        label, options = binary_label, "--loss_function hinge" if case == "svm" else "--loss_function logistic"
        name = options.split()[-1]
    train = vw_file(batches, work / f"{case}-train.vw", label)
    valid = vw_file([val], work / f"{case}-validation.vw", label)
    seconds = vw_fit(train, work / f"{case}.vw-model", options)
    raw = vw_predict(work / f"{case}.vw-model", valid)
    if case == "softmax":
        predicted = classes[raw.astype(int) - 1]
    elif case == "linear-regression":
        predicted = raw
    else:
        predicted = (raw > 0).astype(np.float32)  # a margin (hinge) or a logit: positive is class 1
    return f"Vowpal Wabbit {name}, 1 pass", predicted, seconds


def model_peers(case: str, parts: tuple, work: Path) -> list[tuple[str, float, float]]:
    """(name, seconds, quality) of every peer of `case` on the `split` `parts`."""
    metric = _common.MODEL_CASES[case][2]
    batches, X, y, Xv, val = parts
    if metric == "inertia":
        from sklearn.cluster import KMeans, MiniBatchKMeans

        rows = []
        for name, fit in [("sklearn KMeans", lambda: KMeans(8, random_state=0).fit(X)),
                          ("sklearn MiniBatchKMeans", lambda: MiniBatchKMeans(8, random_state=0).fit(X))]:
            peer, seconds = timed(fit)
            rows.append((name, seconds, mean_inertia(peer.cluster_centers_, X)))
    else:
        classes = np.unique(np.concatenate([y, val.labels]))
        rows = [(name, seconds, quality(metric, predicted, val.labels)) for name, predicted, seconds in
                [*sklearn_peers(case, batches, X, y, Xv), vw_peer(case, batches, val, classes, work)]]
    for name, seconds, value in rows:
        print(f"    {name:<44} {seconds:8.2f} s  {metric} {value:.4f}", flush=True)
    return rows
