#!/usr/bin/env python
"""Seconds (and epochs) to a target validation loss: mlless with its defaults against the best single-machine tools.

Every system trains on the same prepared train/validation split (`mlless prepare`), on this machine, in one run:

PMF (validation RMSE; rank 20 everywhere)
  * LIBMF (PyPI `libmf`), 2 and 1 threads, L2 0.05 on P and Q, no L1 (the binding's default L1 zeroes
    every factor); fitted on ratings minus their mean, one fit per iteration count 1..10, timed whole
    (its setup included). Predictions are computed from its P and Q: the binding's `predict` returns garbage.
  * scikit-surprise `SVD` (its defaults: lr 0.005, reg 0.02, init std 0.1) for 1, 2, 5, 10, 20 epochs.
  * PyTorch: biased MF with sparse embeddings and `SparseAdam` (lr 0.01, batch 1024), as its docs show
    sparse embeddings trained; torch threads = the machine's cores; one evaluation per epoch. An optional peer:
    without torch its row says "not installed".
  * mlless: `mlless train` with only `model.type` (plus the P, transport and protocol under test): the model's
    default protocol at P = 1, 2 and 3, and at P = 2 each other protocol the model pairs with (the evidence for the
    default), on the embedded transport and (without --quick) over Redis + RabbitMQ. Its time is read from
    metrics.jsonl: the first evaluation at or below the target, from the job's start and from its first step.

LR (validation BCE)
  * Vowpal Wabbit (PyPI `vowpalwabbit`): `--loss_function logistic --link logistic -b 18` (its defaults:
    adaptive, normalised, invariant updates, lr 0.5), one pass over a text file in VW's format, parsing included.
  * scikit-learn: `SGDClassifier(loss="log_loss")` `partial_fit` on the same CSR batches (epochs 1..5), and
    `LogisticRegression` (lbfgs, C=1) on the whole CSR matrix.
  * mlless as for PMF.

The models of issue #23 (`--datasets models`, or any of svm, softmax, linear-regression, dense-lr, kmeans; 200k rows
each):
  * the peers of `benchmarks/model_peers.py` at their documented good settings (scikit-learn and Vowpal Wabbit);
  * mlless with only `model.type` at each `--model-workers` P, trained from scratch for each `--model-epochs` limit
    until its validation accuracy (RMSE) is within 0.01 (2 %) of the best peer's, the issue's bar; k-means until its
    training inertia is within 3 % of scikit-learn's `KMeans`. Its seconds
    are the whole `mlless train` process's (start-up included): per-evaluation accuracy is not in metrics.jsonl.

Targets (the anchor's converged quality plus a margin): LIBMF's 10-iteration RMSE (2 threads) + 0.01 on the
synthetic ratings; Surprise's 20-epoch RMSE on the MovieLens sample; VW's one-pass BCE + 0.005 on the clicks.

Data (prepared under --data-dir on first use): the MovieLens sample; 10M synthetic ratings (70k x 10k),
uniform and Zipf-skewed (`--skew 0.8`, the default); 1M synthetic Criteo-layout clicks (2^18 hashed features).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from model_peers import CASES, time_to_peer_quality  # noqa: E402

from mlless.data.batches import RatingsBatch, SparseBatch  # noqa: E402
from mlless.data.dataset import Dataset  # noqa: E402
from mlless.spec.config import default_sync  # noqa: E402
from mlless.spec.schema import pairing_errors  # noqa: E402
from mlless.telemetry.rows import evaluated  # noqa: E402

RANK = 20
CORES = os.cpu_count() or 1


@dataclass
class Curve:
    """One system's validation loss after each unit of training (iteration / epoch / evaluation)."""

    system: str
    points: list[tuple[float, float, float]] = field(default_factory=list)  # (seconds, epochs, loss)
    note: str = ""
    startup: float | None = None  # mlless: seconds before the first step (process start, workers connecting)
    summary: dict | None = None  # mlless: the run's summary.json (cost, bytes sent, final loss)
    run_dir: Path | None = None  # mlless: where the run wrote metrics.jsonl and summary.json

    def add(self, seconds: float, epochs: float, loss: float) -> None:
        self.points.append((seconds, epochs, loss))
        print(f"    {self.system:<34} {epochs:6.2f} ep {seconds:8.2f} s  loss {loss:.4f}", flush=True)

    def reached(self, target: float) -> tuple[float, float] | None:
        for seconds, epochs, loss in self.points:
            if loss <= target:
                return seconds, epochs
        return None

    @property
    def best(self) -> float:
        return min((p[2] for p in self.points), default=math.nan)


# ---- data --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DataSet:
    key: str
    title: str
    prepare_args: tuple[str, ...]


DATASETS = {
    "movielens": DataSet("movielens", "MovieLens sample (100k ratings)", ("--sample", "movielens-small")),
    "pmf10m": DataSet("pmf10m", "synthetic 10M ratings, uniform ids",
                      ("--synthetic", "pmf", "--rows", "10000000", "--users", "70000", "--items", "10000", "--skew", "0")),
    "pmf10m-skew": DataSet("pmf10m-skew", "synthetic 10M ratings, Zipf 0.8 ids",
                           ("--synthetic", "pmf", "--rows", "10000000", "--users", "70000", "--items", "10000")),
    "lr": DataSet("lr", "synthetic Criteo-layout clicks, 1M rows, 2^18 features", ("--synthetic", "lr", "--rows", "1000000")),
    "higgs": DataSet("higgs", "synthetic Higgs-like dense set, 1M rows, 28 features",
                     ("--synthetic", "higgs", "--rows", "1000000")),
}
QUICK = {
    "movielens": DATASETS["movielens"],
    "pmf1m-skew": DataSet("pmf1m-skew", "synthetic 1M ratings, Zipf 0.8 ids",
                          ("--synthetic", "pmf", "--rows", "1000000", "--users", "20000", "--items", "4000")),
    "lr200k": DataSet("lr200k", "synthetic Criteo-layout clicks, 200k rows", ("--synthetic", "lr", "--rows", "200000")),
}

#: The models of issue #23, each on its `model_peers.CASES` synthetic set.
MODEL_SETS = {case: DataSet(case, f"{case} on synthetic {synthetic}, 200k rows", ("--synthetic", synthetic, "--rows", "200000"))
              for case, (_, synthetic, _) in CASES.items()}

#: Every data set, quick or not, by key.
ALL_SETS = {**DATASETS, **QUICK, **MODEL_SETS}


def prepared(data_dir: Path, key: str) -> Path:
    """Data set `key` prepared under `data_dir` (once), where every script that shares these sets looks for it."""
    return _common.prepare(data_dir / f"ttq-{key}", *ALL_SETS[key].prepare_args)


def all_batches(ds: Dataset) -> list[RatingsBatch | SparseBatch]:
    return [ds.batch(i) for i in range(ds.n_batches)]


def ratings(ds: Dataset) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    bs = all_batches(ds)
    return (np.concatenate([b.users for b in bs]), np.concatenate([b.items for b in bs]),
            np.concatenate([b.ratings for b in bs]).astype(np.float32))


def rmse(pred: np.ndarray, truth: np.ndarray, lo: float | None, hi: float | None) -> float:
    if lo is not None:
        pred = np.clip(pred, lo, hi)
    return float(np.sqrt(np.mean((pred.astype(np.float64) - truth) ** 2)))


def bce(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p.astype(np.float64), 1e-12, 1 - 1e-12)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


# ---- PMF peers -------------------------------------------------------------------------------------------------

def run_libmf(ds: Dataset, threads: int, iters: int) -> Curve:
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


def run_surprise(ds: Dataset, epochs: list[int]) -> Curve:
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


def run_torch(ds: Dataset, epochs: int, max_seconds: float) -> Curve:
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


def pmf_target(key: str, ds: Dataset, libmf2: Curve | None = None, surprise: Curve | None = None) -> tuple[Curve, float]:
    """The anchor run and target validation RMSE of PMF set `key`: Surprise's 20-epoch RMSE on the MovieLens sample,
    LIBMF's 10-iteration RMSE (2 threads) + 0.01 on the synthetic ratings. The anchor is run unless it is given."""
    if key == "movielens":
        anchor = surprise or run_surprise(ds, [20])
        return anchor, anchor.points[-1][2]
    anchor = libmf2 or run_libmf(ds, 2, 10)
    return anchor, anchor.points[-1][2] + 0.01


def lr_target(ds: Dataset, data_dir: Path, vw: Curve | None = None) -> tuple[Curve, float]:
    """The anchor run and target validation BCE of an LR set: Vowpal Wabbit's one-pass BCE + 0.005 (run unless given)."""
    anchor = vw or run_vw(ds, data_dir)
    return anchor, anchor.points[0][2] + 0.005


# ---- LR peers --------------------------------------------------------------------------------------------------

def vw_pass(batches: list[SparseBatch], val: SparseBatch, out: Path) -> tuple[float, float]:
    """(validation BCE, seconds) of Vowpal Wabbit's one pass, logistic loss, over `batches`; its files go in OUT."""
    from vowpalwabbit import pyvw

    out.mkdir(parents=True, exist_ok=True)
    train, valid = _common.vw_file(batches, out / "train.vw"), _common.vw_file([val], out / "validation.vw")
    model = out / "vw.model"
    started = time.perf_counter()
    vw = pyvw.Workspace(f"--data {train} --loss_function logistic --link logistic -b 18 --quiet -f {model}")
    vw.run_parser()
    vw.finish()
    seconds = time.perf_counter() - started
    test = pyvw.Workspace(f"-t -i {model} --quiet --link logistic")
    probs = np.array([test.predict(line) for line in valid.read_text().splitlines()], np.float64)
    test.finish()
    return bce(probs, val.labels), seconds


def run_vw(ds: Dataset, data_dir: Path) -> Curve:
    loss, seconds = vw_pass(all_batches(ds), ds.validation(), data_dir)
    curve = Curve("Vowpal Wabbit, 1 pass")
    curve.add(seconds, 1, loss)
    return curve


def csr(batches: list[SparseBatch], n_features: int):
    import scipy.sparse as sp

    return [sp.csr_matrix((b.values, b.indices, b.indptr), shape=(len(b.labels), n_features)) for b in batches]


def run_sgd_classifier(ds: Dataset, epochs: int) -> Curve:
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


def run_logistic_regression(ds: Dataset, max_iter: int) -> Curve:
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


# ---- mlless ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MllessRun:
    workers: int
    services: bool
    protocol: str | None  # None: the model's default, as a user would get it
    v: float | None = None  # ISP's significance threshold; None keeps the default, as a user would

    def label(self, kind: str) -> str:
        v = "" if self.v is None else f" v={self.v:g}"
        protocol = f"default ({default_sync(kind).protocol})" if self.protocol is None else self.protocol.upper()
        return f"mlless P={self.workers} {'Redis+RabbitMQ' if self.services else 'embedded'} {protocol}{v}"


def run_mlless(ds: Dataset, data: Path, kind: str, run: MllessRun, target: float, max_seconds: float, base: Path,
               urls: tuple[str, str] = (_common.REDIS, _common.AMQP)) -> Curve:
    """`mlless train` with only model.type set (over Redis + RabbitMQ at ``urls`` when ``run.services``); the curve is
    every evaluation in metrics.jsonl, timed from the job's start."""
    import yaml

    name = f"ttq-{kind[:3]}-{run.workers}-{'svc' if run.services else 'emb'}-{run.protocol or 'default'}"
    sync: dict[str, Any] = {} if run.protocol is None else {"protocol": run.protocol}
    if run.v is not None:
        name += f"-v{run.v:g}".replace(".", "-")
        sync["significanceThreshold"] = run.v
    job = base / f"{name}.yaml"
    spec = {"workers": run.workers, "model": {"type": kind}, "dataset": {"uri": str(data), "cacheBatches": True},
            **({"sync": sync} if sync else {}), "stop": {"targetLoss": float(target), "maxSeconds": float(max_seconds)}}
    job.write_text(yaml.safe_dump({"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob",
                                   "metadata": {"name": name}, "spec": spec}, sort_keys=False))
    out = base / f"run-{name}-{int(time.time() * 1000) % 10**8}"
    started = time.perf_counter()
    _common.mlless_train(job, out, run.services, redis_url=urls[0], amqp_url=urls[1])
    process_seconds = time.perf_counter() - started
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = Curve(run.label(kind), startup=summary["startup_seconds"], summary=summary, run_dir=out)
    for row, new in zip(rows, evaluated(rows)):
        if new:
            curve.add(row["time"], row["epoch"], row["validation_loss"])
    curve.note = (f"stop: {summary['stop_reason']}; start-up {summary['startup_seconds']:.2f} s; "
                  f"whole process {process_seconds:.1f} s")
    return curve


#: The protocols tried beside a model's default, at P = 2: the evidence for the default (RESULTS.md).
ALTERNATIVES = ("isp", "bsp", "averaging", "blocked", "async")


def mlless_runs(kind: str, quick: bool) -> list[MllessRun]:
    """The default protocol at P = 1, 2 and 3, and at P = 2 every other one the model pairs with; on the embedded
    transport, and (unless `quick`) over Redis + RabbitMQ."""
    default = default_sync(kind).protocol
    others = [p for p in ALTERNATIVES if p != default and not any(pairing_errors({"model": {"type": kind},
                                                                                   "sync": {"protocol": p}}))]
    return [MllessRun(workers, services, protocol)
            for services in ([False] if quick else [False, True])
            for workers, protocol in [(1, None), (2, None), (3, None)] + [(2, p) for p in others]]


# ---- the comparison --------------------------------------------------------------------------------------------

def section(title: str, anchor: str, target: float, curves: list[Curve]) -> str:
    rows = []
    anchor_curve = next(c for c in curves if c.system == anchor)
    anchor_time = anchor_curve.reached(target)
    for c in curves:
        hit = c.reached(target)
        first_step = None
        if hit is not None and c.startup is not None:
            first_step = hit[0] - c.startup
        ratio = (hit[0] / anchor_time[0]) if hit is not None and anchor_time else None
        rows.append((c.system, None if hit is None else hit[0], first_step, None if hit is None else hit[1],
                     None if ratio is None else f"{ratio:.2f}x", c.best, c.note))
    table = _common.table(["system", "seconds to target", "from first step", "epochs to target",
                           f"vs {anchor}", "best loss seen", "note"], rows)
    return f"#### {title}: target {target:.4f}\n\n{table}\n"


def pmf_comparison(key: str, ds: Dataset, data: Path, base: Path, args: argparse.Namespace) -> str:
    print(f"== {key}", flush=True)
    curves = [run_libmf(ds, 2, 10), run_libmf(ds, 1, 10)]
    surprise = run_surprise(ds, [1, 2, 5, 10, 20] if ds.manifest.n_train < 2_000_000 else [args.surprise_epochs])
    curves.append(surprise)
    anchor, target = pmf_target(key, ds, curves[0], surprise)
    curves.append(run_torch(ds, args.torch_epochs, args.torch_seconds))
    for run in mlless_runs("pmf", args.quick):
        curves.append(run_mlless(ds, data, "pmf", run, target, args.max_seconds, base))
    return section(ALL_SETS[key].title, anchor.system, target, curves)


def models_comparison(key: str, ds: Dataset, data: Path, base: Path, args: argparse.Namespace) -> str:
    print(f"== {key}", flush=True)
    return time_to_peer_quality(key, ds, data, base / key, args.model_workers, args.model_epochs)


def lr_comparison(key: str, ds: Dataset, data: Path, base: Path, args: argparse.Namespace) -> str:
    print(f"== {key}", flush=True)
    vw, target = lr_target(ds, data)
    curves = [vw, run_sgd_classifier(ds, 5), run_logistic_regression(ds, args.lbfgs_iter)]
    for run in mlless_runs("logistic-regression", args.quick):
        curves.append(run_mlless(ds, data, "logistic-regression", run, target, args.max_seconds, base))
    return section(ALL_SETS[key].title, vw.system, target, curves)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR, help="prepared datasets and runs (default %(default)s)")
    p.add_argument("--datasets", default=",".join(DATASETS),
                   help=f"comma list of %(default)s, {', '.join(MODEL_SETS)}, or 'models' for the last {len(MODEL_SETS)}")
    p.add_argument("--quick", action="store_true",
                   help="small data (MovieLens, 1M skewed ratings, 200k clicks) and mlless on the embedded transport only; ~3 min")
    p.add_argument("--max-seconds", type=float, default=120, help="cap on each mlless run (default 120)")
    p.add_argument("--surprise-epochs", type=int, default=5, help="Surprise epochs on the large sets (default 5; ~10 s each)")
    p.add_argument("--torch-epochs", type=int, default=10, help="PyTorch epochs at most (default 10)")
    p.add_argument("--torch-seconds", type=float, default=120, help="PyTorch stops after the epoch that passes this (default 120)")
    p.add_argument("--lbfgs-iter", type=int, default=100, help="LogisticRegression max_iter (default 100, sklearn's)")
    p.add_argument("--model-workers", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2],
                   help="the models' sets: mlless's P values, a comma list (default 1,2)")
    p.add_argument("--model-epochs", type=lambda v: [float(x) for x in v.split(",")], default=[1, 2, 3, 5],
                   help="the models' sets: mlless's epoch limits, tried in turn until one reaches the peer's quality "
                        "(default 1,2,3,5)")
    p.add_argument("--write-results", action="store_true", help="refresh this script's section of RESULTS.md")
    args = p.parse_args(argv)
    keys = [k for name in args.datasets.split(",") for k in (MODEL_SETS if name == "models" else [name])]
    sets = QUICK if args.quick else {k: ALL_SETS[k] for k in keys}
    info = _common.machine_info()
    print(_common.machine_line(info), flush=True)
    base = args.data_dir / "time-to-quality"
    base.mkdir(parents=True, exist_ok=True)
    parts = []
    for key, spec in sets.items():
        data = prepared(args.data_dir, key)
        ds = Dataset.open(str(data))
        compare: Callable[..., str] = (models_comparison if key in MODEL_SETS else
                                       pmf_comparison if ds.kind == "ratings" else lr_comparison)
        part = compare(key, ds, data, base, args)
        print(part, flush=True)
        parts.append(part)
    body = "\n".join([
        "### Time to quality (`benchmarks/time_to_quality.py`)",
        "",
        f"Machine: {_common.machine_line(info)}. Command: `{_common.command_line()}`.",
        "",
        "Seconds are training time as each tool reports it in this run: LIBMF's and Surprise's whole `fit` for that "
        "many iterations, PyTorch's and sklearn's training loops, VW's one pass over its text file, and for mlless the "
        "time from the job's start (supervisor up, workers being started) to the first evaluation at or below the target; "
        "'from first step' subtracts mlless's start-up. mlless is given only `model.type`.",
        "",
        *parts,
    ])
    if args.write_results:
        # The models' sets alone are a section of their own, and leave the other sets' figures as they are.
        _common.update_results("time_to_quality" if set(sets) - set(MODEL_SETS) else "time_to_quality_models", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
