#!/usr/bin/env python
"""Criteo-layout LR quality: `mlless train` (4 workers) vs scikit-learn LogisticRegression.

1. Writes a Criteo-layout TSV (label, 13 integer columns, 26 hexadecimal categorical
   columns, some blanks) drawn from a planted logistic model: every integer column and
   every (column, value) of a categorical column has a weight; categorical values
   follow a Zipf-like law over per-column vocabularies of 4 to 100,000 values (as in
   Criteo, a few columns are near-constant and a few have huge vocabularies).
2. `mlless prepare --format criteo FILE --out DIR --hash-bits 18` (log1p integers).
3. `mlless train JOB.yaml` with a TrainingJob written here: logistic-regression,
   `spec.workers` 4, the default optimizer (lazy Adam, lr/sqrt(epoch)), ISP v = 0.7,
   `maxEpochs` E.
4. `sklearn.linear_model.LogisticRegression` (lbfgs, C = 1) fit on the SAME hashed
   training features (all batches read with `mlless.data.dataset.Dataset`).
5. Both evaluated on the prepared validation split: BCE and AUC; the planted model's
   own BCE on the raw data is the floor.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

# per-column vocabularies of the 26 categorical columns (Criteo's range from a few values to millions)
VOCAB = [1000, 500, 100_000, 50_000, 200, 20, 10_000, 500, 4, 30_000, 5_000, 80_000, 3_000, 25, 10_000, 60_000,
         10, 5_000, 2_000, 4, 70_000, 15, 15, 40_000, 100, 30_000]
BLANK_INT = [0.0, 0.2, 0.0, 0.2, 0.02, 0.2, 0.04, 0.0, 0.04, 0.45, 0.04, 0.75, 0.2]
BLANK_CAT = [0.0, 0.0, 0.03, 0.03, 0.0, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0, 0.45,
             0.45, 0.03, 0.0, 0.75, 0.03, 0.45, 0.45]


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def write_criteo(path: Path, rows: int, seed: int) -> dict:
    """Write `rows` lines; returns the planted model's stats (positive rate, its own BCE)."""
    rng = np.random.default_rng(seed)
    logit = np.full(rows, -1.2)
    cols: list[np.ndarray] = []
    # integer columns: heavy-tailed counts; weight on log1p(count); blank -> feature absent
    w_int = rng.normal(0, 0.25, 13)
    for j in range(13):
        counts = np.floor(rng.lognormal(mean=rng.uniform(0, 4), sigma=1.5, size=rows)).astype(np.int64)
        if j == 1:
            counts -= rng.integers(0, 3, rows)  # Criteo's column 2 has small negatives
        blank = rng.random(rows) < BLANK_INT[j]
        logit += np.where(blank, 0.0, w_int[j] * np.log1p(np.maximum(counts, 0)))
        s = counts.astype(str).astype(object)
        s[blank] = ""
        cols.append(s)
    # categorical columns: Zipf-like value frequencies, per-value weights
    for c, vocab in enumerate(VOCAB):
        hexes = np.array([f"{h:08x}" for h in rng.integers(0, 2**32, vocab, dtype=np.uint64)], dtype=object)
        ranks = np.minimum(np.floor(rng.pareto(1.1, rows) * vocab / 20).astype(np.int64), vocab - 1)
        perm = rng.permutation(vocab)
        values = perm[ranks]
        scale = 0.9 if vocab <= 1000 else 0.6
        weights = rng.normal(0, scale, vocab)
        blank = rng.random(rows) < BLANK_CAT[c]
        logit += np.where(blank, 0.0, weights[values])
        s = hexes[values]
        s[blank] = ""
        cols.append(s)
    p = sigmoid(logit - np.mean(logit) - 1.0)  # ~30% positives
    labels = (rng.random(rows) < p).astype(np.int64)
    own_bce = float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))
    with open(path, "w") as fh:
        block = 50_000
        for start in range(0, rows, block):
            stop = min(rows, start + block)
            lab = labels[start:stop].astype(str)
            fields = [lab] + [c[start:stop] for c in cols]
            fh.write("\n".join("\t".join(row) for row in zip(*fields)))
            fh.write("\n")
    return {"positive_rate": float(labels.mean()), "planted_bce": own_bce}


def to_csr(batches, n_features: int):
    mats = [sp.csr_matrix((b.values.astype(np.float64), b.indices, b.indptr), shape=(len(b), n_features))
            for b in batches]
    return sp.vstack(mats, format="csr"), np.concatenate([b.labels for b in batches]).astype(np.float64)


def bce(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p.astype(np.float64), 1e-15, 1 - 1e-15)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


JOB = """\
apiVersion: mlless.io/v1alpha1
kind: TrainingJob
metadata:
  name: bench-criteo-lr
spec:
  workers: {workers}
  model:
    type: logistic-regression
  dataset:
    uri: {data}
    cacheBatches: true
  sync:
    protocol: isp
  stop:
    maxEpochs: {epochs}
  evaluation:
    everySteps: 100
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR,
                   help="where the TSV, prepared data and run go (default %(default)s)")
    p.add_argument("--rows", type=int, default=300_000, help="lines of the Criteo-layout file (default 300,000)")
    p.add_argument("--batch-size", type=int, default=1000, help="prepare batch size (default 1000)")
    p.add_argument("--workers", type=int, default=4, help="mlless workers (default 4)")
    p.add_argument("--epochs", type=float, default=5, help="mlless maxEpochs (default 5)")
    p.add_argument("--redis-url", help="run over Redis + RabbitMQ (with --amqp-url) instead of the embedded broker")
    p.add_argument("--amqp-url")
    p.add_argument("--C", type=float, default=1.0, help="LogisticRegression C (default 1.0)")
    p.add_argument("--max-iter", type=int, default=2000, help="LogisticRegression lbfgs max_iter (default 2000; ~10 min on a loaded 2-core box)")
    p.add_argument("--quick", action="store_true", help="100k rows, 3 epochs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--write-results", action="store_true", help="refresh this script's section of RESULTS.md")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.epochs = 100_000, 3
    info = _common.machine_info()
    print(_common.machine_line(info))

    base = args.data_dir / f"criteo-{args.rows}"
    base.mkdir(parents=True, exist_ok=True)
    tsv = base / "day.tsv"
    stats_file = base / "planted.json"
    if not stats_file.exists():
        t = time.perf_counter()
        stats = write_criteo(tsv, args.rows, args.seed)
        stats_file.write_text(json.dumps(stats))
        print(f"wrote {tsv} ({args.rows:,} lines) in {time.perf_counter() - t:.1f}s: {stats}", flush=True)
    stats = json.loads(stats_file.read_text())
    data = base / f"prepared-b{args.batch_size}"
    prep = ("--format", "criteo", str(tsv), "--hash-bits", "18", "--batch-size", str(args.batch_size))
    _common.prepare(data, *prep)

    # ---- mlless train
    job = base / "job.yaml"
    job.write_text(JOB.format(workers=args.workers, data=data, epochs=args.epochs))
    run = base / f"run-{int(time.time())}"
    cmd = [sys.executable, "-m", "mlless", "train", str(job), "--out", str(run), "-q"]
    transport = "embedded"
    if args.redis_url and args.amqp_url:
        cmd += ["--redis-url", args.redis_url, "--amqp-url", args.amqp_url]
        transport = "Redis + RabbitMQ"
    print("$ mlless " + " ".join(cmd[3:]), flush=True)
    t = time.perf_counter()
    subprocess.run(cmd, check=True)
    ml_wall = time.perf_counter() - t
    summary = json.loads((run / "summary.json").read_text())

    from mlless.data.dataset import Dataset
    from mlless.training.models import load_model

    ds = Dataset.open(str(data))
    val = ds.validation()
    model = load_model(run / "model.npz")
    p_ml = model.predict(val)
    from sklearn.metrics import roc_auc_score
    ml = {"bce": bce(p_ml, val.labels), "auc": float(roc_auc_score(val.labels, p_ml)), "seconds": ml_wall}
    print(f"  mlless: summary validation_loss {summary['validation_loss']:.4f}, recomputed BCE {ml['bce']:.4f}, "
          f"AUC {ml['auc']:.4f}, {summary['steps']} steps, {summary['epochs']:.2f} epochs, {ml_wall:.1f}s", flush=True)

    # ---- scikit-learn on the same hashed features
    from sklearn.linear_model import LogisticRegression

    nf = ds.manifest.n_features
    X, y = to_csr([ds.batch(i) for i in range(ds.n_batches)], nf)
    Xv, yv = to_csr([val], nf)
    t = time.perf_counter()
    clf = LogisticRegression(C=args.C, max_iter=args.max_iter)
    clf.fit(X, y)
    sk_wall = time.perf_counter() - t
    p_sk = clf.predict_proba(Xv)[:, 1]
    sk = {"bce": bce(p_sk, yv), "auc": float(roc_auc_score(yv, p_sk)), "seconds": sk_wall}
    print(f"  sklearn LogisticRegression: BCE {sk['bce']:.4f}, AUC {sk['auc']:.4f}, {sk_wall:.1f}s "
          f"({clf.n_iter_[0]} lbfgs iterations)", flush=True)
    prior = float(np.mean(y))
    base_bce = bce(np.full(len(yv), prior), yv)

    rows = [
        ("mlless train (4 workers, ISP, default Adam)" if args.workers == 4 else f"mlless train ({args.workers} workers)",
         ml["bce"], ml["auc"], f"{summary['epochs']:.2f} epochs / {summary['steps']} steps", ml["seconds"]),
        (f"sklearn LogisticRegression (lbfgs, C={args.C:g})", sk["bce"], sk["auc"], f"{clf.n_iter_[0]} iterations",
         sk["seconds"]),
        ("constant (training positive rate)", base_bce, 0.5, "–", None),
    ]
    t1 = _common.table(["model", "val BCE", "val AUC", "training", "wall s"], rows)
    gap = ml["bce"] - sk["bce"]
    verdict = (f"mlless − sklearn BCE = {gap:+.4f} ({100 * gap / sk['bce']:+.1f}%), AUC {ml['auc'] - sk['auc']:+.4f}; "
               f"planted model's own BCE on all rows {stats['planted_bce']:.4f}, positives {stats['positive_rate']:.1%}.")
    print("\n" + t1 + "\n\n" + verdict)
    if args.write_results:
        body = ["## 3. LR quality on a Criteo-layout file (`benchmarks/lr_quality.py`)", "",
                f"Run: {_common.machine_line(info)}. Transport: {transport}.", "",
                "```", _common.command_line(), "mlless prepare " + " ".join(prep), f"mlless train {job.name}   # written by the script:",
                textwrap.indent(job.read_text().rstrip(), "    "), "```", "",
                f"{args.rows:,} lines ({ds.manifest.n_train:,} train / {ds.manifest.n_validation:,} validation), "
                f"{nf:,} hashed features, batch {ds.manifest.batch_size}.", "", t1, "", verdict, ""]
        _common.update_results("lr_quality", "\n".join(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
