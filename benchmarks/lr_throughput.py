#!/usr/bin/env python
"""Sparse logistic-regression throughput on one core: mlless vs Vowpal Wabbit vs scikit-learn SGDClassifier.

Data: `mlless prepare --synthetic lr --rows 1000000` (hashed categoricals into 2^18
features, batch 6250 as in the paper). Both systems see the SAME mini-batches in the
same order for one epoch:

  * mlless: `Replica.step`, the step a worker runs, with the default LR optimizer
    (lazy Adam, lr 0.01, lr/sqrt(epoch), decoupled weight decay 1e-6) and
    `share=False` (a worker alone); a second row shares, adding the ISP filter (v = 0.7).
  * Vowpal Wabbit (PyPI `vowpalwabbit`), one pass per epoch over the same rows in its
    documented text format (`--loss_function logistic -b 18`, its own adaptive,
    normalised, invariant updates), written once outside the timing; the time
    includes VW parsing its text, as a first pass pays it.  A second VW row reads
    VW's own binary cache (`--cache_file`, built by an untimed pass first), its
    documented fast path for repeated training.
  * scikit-learn: `SGDClassifier(loss="log_loss").partial_fit(X, y)` per batch, with
    X a `scipy.sparse.csr_matrix` (float64, what SGDClassifier computes in) built from
    each SparseBatch once, outside the timing.

Reported: samples/s (wall and process CPU time; best of --repeat runs by CPU time) and
the validation BCE (mean log loss) each reaches after the epoch.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

_common.single_thread_env()

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

from mlless.data.dataset import Dataset  # noqa: E402
from mlless.spec.config import ModelConfig  # noqa: E402
from mlless.training.models import build_model  # noqa: E402
from mlless.spec.config import default_optimizer  # noqa: E402
from mlless.training.replica import Replica  # noqa: E402


def to_csr(batch, n_features: int) -> sp.csr_matrix:
    return sp.csr_matrix((batch.values.astype(np.float64), batch.indices, batch.indptr),
                         shape=(len(batch), n_features))


def bce(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p.astype(np.float64), 1e-15, 1 - 1e-15)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def auc(p: np.ndarray, y: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score
    return float(roc_auc_score(y, p))


def run_mlless(ds, batches, val, order, epochs, seed, with_filter, v=0.7):
    model = build_model("logistic-regression", ds.dims(), ModelConfig("logistic-regression"), seed)
    replica = Replica(model, default_optimizer("logistic-regression"), v)
    n = step = 0
    with _common.Stopwatch() as sw:
        for e in range(epochs):
            for b in order[e]:
                step += 1
                n += replica.step(batches[b], e + 1, step, share=with_filter).samples
    p = model.predict(val)
    return {"seconds": sw.seconds, "cpu": sw.cpu_seconds, "samples": n, "bce": bce(p, val.labels),
            "auc": auc(p, val.labels)}


def run_vw(train: Path, valid: Path, val_labels, epochs, work: Path, cached: bool = False):
    from vowpalwabbit import pyvw

    model = work / "vw.model"
    cache = work / "train.vw.cache"
    source = f"--data {train}"
    if cached:
        source = f"--cache_file {cache}"
        if not cache.exists():
            warm = pyvw.Workspace(f"--data {train} --cache_file {cache} -b 18 --quiet")
            warm.run_parser()
            warm.finish()
    passes = f"--passes {epochs} --holdout_off" + ("" if cached else " -c -k") if epochs > 1 else ""
    with _common.Stopwatch() as sw:
        vw = pyvw.Workspace(f"{source} --loss_function logistic --link logistic -b 18 {passes} --quiet -f {model}")
        vw.run_parser()
        vw.finish()
    test = pyvw.Workspace(f"-t -i {model} --quiet --link logistic")
    p = np.array([test.predict(line) for line in valid.read_text().splitlines()], np.float64)
    test.finish()
    n = sum(1 for _ in open(train)) * epochs
    return {"seconds": sw.seconds, "cpu": sw.cpu_seconds, "samples": n, "bce": bce(p, val_labels), "auc": auc(p, val_labels)}


def run_sklearn(csrs, labels, xval, yval, order, epochs, seed):
    from sklearn.linear_model import SGDClassifier

    clf = SGDClassifier(loss="log_loss", random_state=seed)
    classes = np.array([0.0, 1.0])
    n = 0
    with _common.Stopwatch() as sw:
        for e in range(epochs):
            for b in order[e]:
                clf.partial_fit(csrs[b], labels[b], classes=classes)
                n += csrs[b].shape[0]
    p = clf.predict_proba(xval)[:, 1]
    return {"seconds": sw.seconds, "cpu": sw.cpu_seconds, "samples": n, "bce": bce(p, yval), "auc": auc(p, yval)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR,
                   help="where the prepared dataset lives / is generated (default %(default)s)")
    p.add_argument("--rows", type=int, default=1_000_000, help="synthetic rows (default 1,000,000)")
    p.add_argument("--epochs", type=int, default=1, help="epochs (default 1)")
    p.add_argument("--repeat", type=int, default=3, help="runs per system; lowest CPU time kept (default 3)")
    p.add_argument("--quick", action="store_true", help="200k rows, 1 repeat")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--write-results", action="store_true", help="refresh this script's section of RESULTS.md")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.repeat = 200_000, 1
    info = _common.machine_info()
    print(_common.machine_line(info))
    name = "lr-1m" if args.rows == 1_000_000 else f"lr-{args.rows}"
    prep_args = ("--synthetic", "lr", "--rows", str(args.rows), "--batch-size", "6250")
    path = _common.prepare(args.data_dir / name, *prep_args)

    ds = Dataset.open(str(path))
    nf = ds.manifest.n_features
    batches = [ds.batch(i) for i in range(ds.n_batches)]
    val = ds.validation()
    csrs = [to_csr(b, nf) for b in batches]
    labels = [b.labels.astype(np.float64) for b in batches]
    xval = to_csr(val, nf)
    order = [np.random.default_rng(args.seed + e).permutation(len(batches)) for e in range(args.epochs)]
    print(f"{ds.manifest.n_train:,} train / {ds.manifest.n_validation:,} validation rows, {nf:,} features, "
          f"{ds.manifest.feature_stats.get('nnz_per_row_mean', 0):.1f} nnz/row, batch {ds.manifest.batch_size}, "
          f"{args.epochs} epoch(s)", flush=True)

    # VW reads the rows in the order written: the first epoch's batch order.
    train_vw = _common.vw_file([batches[b] for b in order[0]], path / "train-ordered.vw")
    valid_vw = _common.vw_file([val], path / "validation.vw")
    results = []
    for label, fn in (("mlless (gradient+Adam)", lambda: run_mlless(ds, batches, val, order, args.epochs, args.seed, False)),
                      ("mlless (+ ISP filter, v=0.7)", lambda: run_mlless(ds, batches, val, order, args.epochs, args.seed, True)),
                      ("Vowpal Wabbit", lambda: run_vw(train_vw, valid_vw, val.labels, args.epochs, path)),
                      ("Vowpal Wabbit, from its cache", lambda: run_vw(train_vw, valid_vw, val.labels, args.epochs, path, True)),
                      ("sklearn SGDClassifier.partial_fit", lambda: run_sklearn(csrs, labels, xval, val.labels.astype(np.float64),
                                                                                  order, args.epochs, args.seed))):
        runs = [fn() for _ in range(args.repeat)]
        r = min(runs, key=lambda x: x["cpu"])
        r.update(system=label, wall_sps=r["samples"] / r["seconds"], cpu_sps=r["samples"] / r["cpu"],
                 load=_common.loadavg())
        results.append(r)
        print(f"  {label:36s} {r['wall_sps']:>12,.0f} samples/s (wall) {r['cpu_sps']:>12,.0f} (cpu)  "
              f"BCE {r['bce']:.4f}  AUC {r['auc']:.4f}  load {r['load']}", flush=True)

    t1 = _common.table(["system", "samples/s (wall)", "samples/s (CPU)", "train s", "val BCE", "val AUC", "load avg after"],
                       [(r["system"], r["wall_sps"], r["cpu_sps"], r["seconds"], r["bce"], r["auc"], r["load"])
                        for r in results])
    by = {r["system"]: r for r in results}
    rows = []
    for peer, target in (("Vowpal Wabbit", 1.0), ("Vowpal Wabbit, from its cache", 1.0),
                         ("sklearn SGDClassifier.partial_fit", 2.0)):
        base = by[peer]
        for r in results[:2]:
            w, c = r["wall_sps"] / base["wall_sps"], r["cpu_sps"] / base["cpu_sps"]
            rows.append((r["system"], peer, f"{w:.2f}x", f"{c:.2f}x", f"≥ {target:g}x", f"{r['bce'] - base['bce']:+.4f}",
                         "met" if min(w, c) >= target and r["bce"] <= base["bce"] + 0.01 else "MISSED"))
    t2 = _common.table(["mlless path", "vs", "speed-up (wall)", "speed-up (CPU)", "target", "Δ BCE (mlless − peer)",
                        "target met?"], rows)
    print("\n" + t1 + "\n\n" + t2)
    if args.write_results:
        body = ["## 2. Sparse LR throughput (`benchmarks/lr_throughput.py`)", "",
                f"Run: {_common.machine_line(info)}.", "",
                "```", _common.command_line(), "mlless prepare " + " ".join(prep_args), "```", "",
                f"{ds.manifest.n_train:,} training rows, {nf:,} hashed features, batch {ds.manifest.batch_size}, "
                f"{args.epochs} epoch(s), best of {args.repeat} runs by CPU time.", "", t1, "", t2, ""]
        _common.update_results("lr_throughput", "\n".join(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
