#!/usr/bin/env python
"""The evidence behind the default optimizers: settings x datasets x P -> epochs and seconds to a target loss.

Each candidate trains in this process with the code a worker runs (`Optimizer.update` on `Model`), P
replicas in lockstep as BSP does: every replica starts a step from the same parameters, trains on its own
mini-batch (the batches taken in a seeded random order, P per step), and the sum of the P applied updates
is the next step's model. Each replica keeps its own optimizer state, as a worker does. So the table
isolates the optimizer and P, without process or protocol costs: `time_to_quality.py` measures those.

Targets are the anchors of `time_to_quality.py`, computed in the same run: LIBMF's 10-iteration validation
RMSE (2 threads) + 0.01 on the synthetic ratings, Surprise's 20-epoch RMSE on the MovieLens sample, and
Vowpal Wabbit's one-pass BCE + 0.005 on the clicks. The model is evaluated 4 times per epoch.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import time_to_quality as ttq  # noqa: E402

from mlless.data.batches import Batch  # noqa: E402
from mlless.data.dataset import Dataset  # noqa: E402
from mlless.spec.config import ModelConfig  # noqa: E402
from mlless.training.models import build_model  # noqa: E402
from mlless.spec.config import OptimizerConfig, default_optimizer  # noqa: E402
from mlless.training.optim import Optimizer  # noqa: E402
from mlless.training.significance import SignificanceFilter  # noqa: E402


@dataclass(frozen=True)
class Candidate:
    label: str
    optimizer: OptimizerConfig
    l2: float | None = None  # None: the model's default


# The default for PMF is adagrad at lr 0.2 for P <= 2 and 0.4/P above: the lr 0.2 rows at P = 1, 2 and the lr 0.1
# rows at P = 4 (`mlless.training.optim.default_optimizer`).
PMF = [
    Candidate("adagrad lr 0.2", OptimizerConfig(type="adagrad", learning_rate=0.2)),
    Candidate("adagrad lr 0.1", OptimizerConfig(type="adagrad", learning_rate=0.1)),
    Candidate("adagrad lr 0.05", OptimizerConfig(type="adagrad", learning_rate=0.05)),
    Candidate("adagrad lr 0.2, l2 0.01", OptimizerConfig(type="adagrad", learning_rate=0.2), 0.01),
    Candidate("adagrad lr 0.2, l2 0.1", OptimizerConfig(type="adagrad", learning_rate=0.2), 0.1),
    Candidate("adam lr 0.01", OptimizerConfig(type="adam", learning_rate=0.01)),
    Candidate("nesterov lr 4, μ 0.8 (papers)", OptimizerConfig(type="nesterov", learning_rate=4.0, momentum=0.8), 0.1),
]
LR = [
    Candidate("adam lr 0.01, lr/√epoch", default_optimizer("logistic-regression")),
    Candidate("adam lr 0.005, lr/√epoch", OptimizerConfig(type="adam", learning_rate=0.005, lr_decay="sqrt-epoch")),
    Candidate("adam lr 0.03, lr/√epoch", OptimizerConfig(type="adam", learning_rate=0.03, lr_decay="sqrt-epoch")),
    Candidate("adagrad lr 0.1", OptimizerConfig(type="adagrad", learning_rate=0.1)),
    Candidate("adagrad lr 0.05", OptimizerConfig(type="adagrad", learning_rate=0.05)),
]


def simulate(ds: Dataset, batches: list, kind: str, cand: Candidate, workers: int, epochs: float, target: float,
             evals_per_epoch: int = 4, v: float = 0.0, val: Batch | None = None
             ) -> tuple[float | None, float | None, float]:
    """(epochs to target, seconds to target, best loss) for `workers` replicas summing their updates.

    Each replica keeps its own optimizer state and an ISP filter at threshold `v` (0: BSP, every update whole),
    trains on its own mini-batch with the job's P, and adds what its peers' filters sent. Replica 0 is evaluated
    on `val` (default: the data set's validation split)."""
    models = [build_model(kind, ds.dims(), ModelConfig(kind, l2=cand.l2), seed=0) for _ in range(workers)]
    cfg = cand.optimizer.replace(weight_decay=models[0].weight_decay)
    optimizers = [Optimizer(m.size, cfg, m.accumulator_size) for m in models]
    filters = [SignificanceFilter(m.params, v) for m in models]
    val = ds.validation() if val is None else val
    rng = np.random.default_rng(0)
    per_epoch = -(-len(batches) // workers)
    every = max(1, per_epoch // evals_per_epoch)
    order = np.concatenate([rng.permutation(len(batches)) for _ in range(int(np.ceil(epochs)) + 1)])
    seconds, best = 0.0, np.inf
    for step in range(int(epochs * per_epoch)):
        lr = cfg.lr_at(step * workers // len(batches) + 1)
        started = time.perf_counter()
        sent = []
        for model, opt, filt, b in zip(models, optimizers, filters, order[step * workers:(step + 1) * workers]):
            idx, delta, _, _ = opt.update(model, batches[b], lr, workers)
            if workers > 1:
                sent.append(filt.step(idx, delta, step + 1))
        for p, (model, filt) in enumerate(zip(models, filters)):
            for q, (idx, delta) in enumerate(sent):
                if q != p and len(idx):
                    model.params[idx] += delta
                    filt.touched(idx, delta)
        seconds += time.perf_counter() - started
        if (step + 1) % every == 0:
            loss = models[0].loss(*models[0].evaluate(val))
            best = min(best, loss)
            if loss <= target:
                return (step + 1) / per_epoch, seconds, best
            if not np.isfinite(loss) or loss > 10:
                break
    return None, None, best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR, help="prepared datasets (default %(default)s)")
    p.add_argument("--datasets", default="movielens,pmf10m,pmf10m-skew,lr", help="comma list of %(default)s")
    p.add_argument("--workers", default="1,2,4", help="comma list of P (default %(default)s)")
    p.add_argument("--epochs", type=float, default=6, help="epochs at most per candidate (default %(default)s)")
    p.add_argument("--quick", action="store_true", help="the small data sets of time_to_quality.py --quick, P = 1, 2")
    p.add_argument("--write-results", action="store_true", help="refresh this script's section of RESULTS.md")
    args = p.parse_args(argv)
    sets = ttq.QUICK if args.quick else {k: ttq.DATASETS[k] for k in args.datasets.split(",")}
    workers = [1, 2] if args.quick else [int(w) for w in args.workers.split(",")]
    info = _common.machine_info()
    print(_common.machine_line(info), flush=True)
    rows = []
    for key, spec in sets.items():
        data = _common.prepare(args.data_dir / f"ttq-{key}", *spec.prepare_args)
        ds = Dataset.open(str(data))
        if ds.kind == "ratings":
            kind, candidates = "pmf", PMF
            target = ttq.pmf_target(key, ds)[1]
        else:
            kind, candidates = "logistic-regression", LR
            target = ttq.run_vw(ds, data).points[0][2] + 0.005
        batches = [ds.batch(i) for i in range(ds.n_batches)]
        for cand in candidates:
            for w in workers:
                ep, sec, best = simulate(ds, batches, kind, cand, w, args.epochs, target)
                print(f"  {key:<12} {cand.label:<34} P={w}: epochs {ep}, seconds {sec}, best {best:.4f}", flush=True)
                rows.append((spec.title, f"{target:.4f}", cand.label, w, ep, sec, best))
    body = "\n".join([
        "### Choosing the defaults (`benchmarks/defaults.py`)",
        "",
        f"Machine: {_common.machine_line(info)}. Command: `{_common.command_line()}`.",
        "",
        "PMF's default is `adagrad` at lr 0.2 for P ≤ 2 and 0.4/P above, with L2 = 1/(ratings per row) (the rows "
        "without an explicit l2); LR's is Adam lr 0.01 with lr/√epoch. "
        "P replicas in lockstep in one process (each step: P mini-batches from the same model, the sum of the P "
        f"applied updates), {args.epochs:g} epochs at most, 4 evaluations per epoch; seconds are the optimizer's "
        "compute time only. '–' = not reached.",
        "",
        _common.table(["data", "target", "setting", "P", "epochs to target", "seconds to target", "best loss"], rows),
    ])
    if args.write_results:
        _common.update_results("defaults", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
