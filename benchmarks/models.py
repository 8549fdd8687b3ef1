#!/usr/bin/env python
"""The models of issue #23 against their single-machine peers: quality and seconds, in one run, on this machine.

Every system trains on the same prepared train/validation split (`mlless prepare --synthetic ...`); the cases and
their peers are `benchmarks/model_peers.py`'s. mlless runs `mlless train` with only `model.type` (and P, on the
embedded broker; `--optimizer` names another) for at most `--epochs` epochs; its quality is its saved model's on the
validation split, its time the job's wall time. Quality: accuracy for the classifiers, validation RMSE for
regression, training inertia / rows for k-means (against scikit-learn's `KMeans` and `MiniBatchKMeans` at their
defaults, k = 8, k-means++, on Gaussian blobs of unequal sizes and spreads). `benchmarks/time_to_quality.py --datasets models` times the same cases to their peers' quality.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from model_peers import (CASES, kmeans_peers, mlless_predictions, mlless_quality, mlless_run, quality,  # noqa: E402
                         sklearn_peers, split, vw_peer)

from mlless.data.dataset import Dataset  # noqa: E402

def kmeans_rows(data: Path, parts: tuple, workers: list[int], epochs: float,
                work: Path) -> list[tuple[str, float, float]]:
    """(system, seconds, training inertia / rows) of mlless at each P and scikit-learn's KMeans and MiniBatchKMeans,
    each with its inertia's ratio to KMeans's in the name."""
    rows = []
    for p in workers:
        model, seconds, summary = mlless_run("kmeans", data, p, epochs, work, None)
        rows.append((f"mlless kmeans, P = {p}, {summary['epochs']:.2f} epochs", seconds,
                     mlless_quality(model, "inertia", parts)))
        print(rows[-1], flush=True)
    rows += kmeans_peers(parts[1])
    reference = rows[len(workers)][2]
    return [(f"{name} ({value / reference:.4f} x KMeans)", seconds, value) for name, seconds, value in rows]


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
            rows = kmeans_rows(data, parts, args.workers, args.epochs, args.data_dir)
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
