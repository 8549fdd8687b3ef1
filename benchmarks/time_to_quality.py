"""Seconds (and epochs) to a target validation loss: mlless with its defaults against the best single-machine tools.

Every system trains on the same prepared train/validation split (`mlless prepare`), on this machine, in one run.
The peers and the targets are `_peers.py`'s (LIBMF 2 and 1 threads, Surprise SVD and PyTorch SparseAdam on the
ratings; Vowpal Wabbit one pass, scikit-learn SGDClassifier and LogisticRegression on the clicks; targets: LIBMF's
10-iteration RMSE + 0.01, Surprise's 20-epoch RMSE on the MovieLens sample, VW's one-pass BCE + 0.005).

mlless: `mlless train` with only `model.type` (plus the P, transport and protocol under test): the model's default
protocol at P = 1, 2 and 3, and at P = 2 each other protocol the model pairs with (the evidence for the default), on
the embedded transport and (without --quick) over Redis + RabbitMQ. Its time is read from metrics.jsonl: the first
evaluation at or below the target, from the job's start and from its first step.

The models of issue #23 (`--datasets models`, or any of svm, softmax, linear-regression, dense-lr, kmeans; 200k
rows each): their peers at their documented good settings, then mlless with only `model.type` at each
`--model-workers` P, trained from scratch for each `--model-epochs` limit until its validation accuracy (RMSE) is
within 0.01 (2 %) of the best peer's, the issue's bar; k-means until its training inertia is within 3 % of
scikit-learn's `KMeans`. Its seconds are the whole `mlless train` process's (start-up included).

Further parts (`--parts`):
  * throughput: samples per second on one core of the step a worker runs (`Replica.step`, alone and with the ISP
    filter, v = 0.7), beside the peers' fits of one epoch (LIBMF 1 thread, Surprise; VW's pass, SGDClassifier);
  * defaults: the evidence for the default optimizers: candidate settings x P (P replicas summing their updates in
    this process with the worker's `Optimizer.update`) -> epochs and compute seconds to the same targets.

Data (prepared under --data-dir on first use): the MovieLens sample; 10M synthetic ratings (70k x 10k), uniform
and Zipf-skewed (0.8); 1M synthetic Criteo-layout clicks; a 1M-row Higgs-like dense set. --quick: the MovieLens
sample, 1M skewed ratings and 200k clicks, mlless on the embedded transport.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import _common, _peers, _runs
from ._common import Curve

#: The protocols tried beside a model's default, at P = 2: the evidence for the default (RESULTS.md).
ALTERNATIVES = ("isp", "bsp", "averaging", "blocked", "async")
#: The issue's bar (#23): accuracy within 0.01 of the peer's; RMSE within 2 % of it, k-means inertia within 3 %.
ACCURACY_MARGIN = 0.01
LOWER_IS_BETTER = {"rmse": 1.02, "inertia": 1.03}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--datasets", help=f"comma list of {', '.join(_common.DATASETS)}, {', '.join(_common.MODEL_SETS)}, "
                                      "or 'models' for the last five (default: the first five; --quick: "
                                      f"{', '.join(_common.QUICK)})")
    p.add_argument("--parts", default="compare", help="comma list of compare, throughput, defaults (default %(default)s)")
    p.add_argument("--max-seconds", type=float, default=120, help="cap on each mlless run (default %(default)s)")
    p.add_argument("--surprise-epochs", type=int, default=5, help="Surprise epochs on the large sets (default 5)")
    p.add_argument("--torch-epochs", type=int, help="PyTorch epochs at most (default 10; --quick 5: it is past its best "
                                                   "by then on the quick sets)")
    p.add_argument("--torch-seconds", type=float, default=120,
                   help="PyTorch stops after the epoch that passes this (default %(default)s)")
    p.add_argument("--lbfgs-iter", type=int, default=100, help="LogisticRegression max_iter (default 100, sklearn's)")
    p.add_argument("--model-workers", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2],
                   help="the models' sets: mlless's P values (default 1,2)")
    p.add_argument("--model-epochs", type=lambda v: [float(x) for x in v.split(",")], default=[1, 2, 3, 5],
                   help="the models' sets: mlless's epoch limits, tried in turn until one reaches the peer's quality "
                        "(default 1,2,3,5)")
    p.add_argument("--defaults-workers", default="1,2,4", help="the defaults part's P (default %(default)s; --quick 1,2)")
    p.add_argument("--defaults-epochs", type=float, default=6, help="the defaults part's epochs at most (default 6)")


def sets_of(args: argparse.Namespace) -> dict[str, _common.DataSet]:
    if args.datasets is None:
        return _common.QUICK if args.quick else _common.DATASETS
    keys = [k for name in args.datasets.split(",") for k in (_common.MODEL_SETS if name == "models" else [name])]
    return {k: _common.ALL_SETS[k] for k in keys}


def run(args: argparse.Namespace) -> str:
    from mlless.data.dataset import Dataset

    base = args.data_dir / "time-to-quality"
    base.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    out = ["Seconds are training time as each tool reports it in this run: LIBMF's and Surprise's whole `fit` for that "
           "many iterations, PyTorch's and sklearn's training loops, VW's one pass over its text file, and for mlless "
           "the time from the job's start (supervisor up, workers being started) to the first evaluation at or below "
           "the target; 'from first step' subtracts mlless's start-up. mlless is given only `model.type`.", ""]
    for key in sets_of(args):
        data = _common.prepared(args.data_dir, key)
        ds = Dataset.open(str(data))
        print(f"== {key}", flush=True)
        if "compare" in parts:
            if key in _common.MODEL_SETS:
                out.append(time_to_peer_quality(key, ds, data, base / key, args.model_workers, args.model_epochs))
            elif ds.kind == "ratings":
                out.append(pmf_comparison(key, ds, data, base, args))
            else:
                out.append(lr_comparison(key, ds, data, base, args))
            print(out[-1], flush=True)
        if key in _common.MODEL_SETS:
            continue
        if "throughput" in parts:
            out.append(throughput(key, ds, data))
        if "defaults" in parts:
            out.append(defaults(key, ds, data, args))
    return "\n".join(out)


# ---- ratings and clicks -------------------------------------------------------------------------------------------

def mlless_runs(kind: str, quick: bool) -> list[_runs.MllessRun]:
    """The default protocol at P = 1, 2 and 3, and at P = 2 every other one the model pairs with; on the embedded
    transport, and (unless `quick`) over Redis + RabbitMQ."""
    from mlless.spec.config import default_sync
    from mlless.spec.schema import pairing_errors

    default = default_sync(kind).protocol
    others = [p for p in ALTERNATIVES if p != default and not any(pairing_errors({"model": {"type": kind},
                                                                                   "sync": {"protocol": p}}))]
    return [_runs.MllessRun(workers, services, protocol)
            for services in ([False] if quick else [False, True])
            for workers, protocol in [(1, None), (2, None), (3, None)] + [(2, p) for p in others]]


def section(title: str, anchor: str, target: float, curves: list[Curve]) -> str:
    rows = []
    anchor_time = next(c for c in curves if c.system == anchor).reached(target)
    for c in curves:
        hit = c.reached(target)
        first_step = hit[0] - c.startup if hit is not None and c.startup is not None else None
        ratio = (hit[0] / anchor_time[0]) if hit is not None and anchor_time else None
        rows.append((c.system, None if hit is None else hit[0], first_step, None if hit is None else hit[1],
                     None if ratio is None else f"{ratio:.2f}x", c.best, c.note))
    table = _common.table(["system", "seconds to target", "from first step", "epochs to target",
                           f"vs {anchor}", "best loss seen", "note"], rows)
    return f"#### {title}: target {target:.4f}\n\n{table}\n"


def pmf_comparison(key: str, ds: Any, data: Path, base: Path, args: argparse.Namespace) -> str:
    curves = [_peers.run_libmf(ds, 2, 10), _peers.run_libmf(ds, 1, 10)]
    surprise = _peers.run_surprise(ds, [1, 2, 5, 10, 20] if ds.manifest.n_train < 2_000_000 else [args.surprise_epochs])
    curves.append(surprise)
    anchor, target = _peers.pmf_target(key, ds, curves[0], surprise)
    curves.append(_peers.run_torch(ds, args.torch_epochs or (5 if args.quick else 10), args.torch_seconds))
    for run in mlless_runs("pmf", args.quick):
        curves.append(_runs.run_mlless(data, "pmf", run, target, args.max_seconds, base))
    return section(_common.ALL_SETS[key].title, anchor.system, target, curves)


def lr_comparison(key: str, ds: Any, data: Path, base: Path, args: argparse.Namespace) -> str:
    vw, target = _peers.lr_target(ds, data)
    curves = [vw, _peers.run_sgd_classifier(ds, 5), _peers.run_logistic_regression(ds, args.lbfgs_iter)]
    for run in mlless_runs("logistic-regression", args.quick):
        curves.append(_runs.run_mlless(data, "logistic-regression", run, target, args.max_seconds, base))
    return section(_common.ALL_SETS[key].title, vw.system, target, curves)


# ---- the models of issue #23 ----------------------------------------------------------------------------------------

def mlless_model(model_type: str, data: Path, workers: int, epochs: float, work: Path) -> tuple[Any, float, dict]:
    """`mlless train` of `model_type` with only P for at most `epochs` epochs on the embedded broker: the handed-back
    model, the process's wall seconds, and summary.json."""
    from mlless.training.models import load_model

    name = f"{model_type}-{workers}-{epochs:g}ep".replace(".", "-")
    job = _runs.write_job(work / f"{name}.yaml", name, {"workers": workers, "model": {"type": model_type},
                                                         "dataset": {"uri": str(data)}, "stop": {"maxEpochs": epochs}})
    run = work / f"run-{name}-{int(time.time() * 1000) % 10**8}"
    started = time.perf_counter()
    _runs.mlless_train(job, run, services=False)
    seconds = time.perf_counter() - started
    return load_model(run / "model.npz"), seconds, _runs.summary(run)


def model_quality(model: Any, metric: str, parts: tuple) -> float:
    """An mlless model's quality as its peers' is measured: k-means on the training rows, the others on the
    validation split."""
    _, X, _, _, val = parts
    if metric == "inertia":
        return _peers.mean_inertia(model.centroids, X)
    out = model.predict(val)
    if metric != "rmse":
        out = (model.classes[out.argmax(axis=1)] if out.ndim == 2  # softmax: class probabilities
               else (out > (0.5 if model.kind == "logistic-regression" else 0.0)).astype(np.float32))
    return _peers.quality(metric, out, val.labels)


def met(metric: str, value: float, target: float) -> bool:
    return value <= target if metric in LOWER_IS_BETTER else value >= target


def time_to_peer_quality(case: str, ds: Any, data: Path, work: Path, workers: list[int], ladder: list[float]) -> str:
    """The peers of `case`, then mlless at each P for each epoch limit of `ladder` (each run from scratch) until one
    reaches the best peer's quality within the issue's margin: a markdown section."""
    model_type, synthetic, metric = _common.MODEL_CASES[case]
    work.mkdir(parents=True, exist_ok=True)
    parts = _peers.split(ds)
    peers = _peers.model_peers(case, parts, work)
    pick = min if metric in LOWER_IS_BETTER else max
    anchor, _, best = pick(peers, key=lambda r: r[2])
    target = best * LOWER_IS_BETTER[metric] if metric in LOWER_IS_BETTER else best - ACCURACY_MARGIN
    rows: list[tuple] = [(name, "–", "–", seconds, value, "yes" if met(metric, value, target) else "no", "")
                         for name, seconds, value in peers]
    verdicts = []
    for p in workers:
        reached = None
        for epochs in ladder:
            model, seconds, summary = mlless_model(model_type, data, p, epochs, work)
            value = model_quality(model, metric, parts)
            hit = met(metric, value, target)
            rows.append((f"mlless {model_type} defaults", p, f"{summary['epochs']:.2f}", seconds, value,
                         "yes" if hit else "no", f"stop: {summary['stop_reason']}"))
            print(f"    mlless P={p} {epochs:g} epochs {seconds:8.2f} s  {metric} {value:.4f}", flush=True)
            if hit:
                reached = (seconds, epochs, value)
                break
        verdicts.append(f"P = {p}: " + (f"**met** in {reached[1]:g} epoch(s), {reached[0]:.1f} s ({metric} "
                                        f"{reached[2]:.4f})" if reached else
                                        f"**missed**: best of {', '.join(f'{e:g}' for e in ladder)} epochs "
                                        f"{pick(r[4] for r in rows if r[1] == p):.4f}"))
    bar = (f"≤ {target:.4f} ({(LOWER_IS_BETTER[metric] - 1) * 100:.0f} % above)" if metric in LOWER_IS_BETTER else
           f"≥ {target:.4f} (0.01 below)")
    table = _common.table(["system", "P", "epochs", "seconds", metric, "at the peer's level", "note"], rows)
    return (f"#### {case}: `mlless prepare --synthetic {synthetic}`, {len(parts[2]):,} training rows; best peer "
            f"{anchor}, {metric} {best:.4f}; target {bar}\n\n{table}\n\n" + "; ".join(verdicts) + ".\n")


# ---- throughput on one core -------------------------------------------------------------------------------------------

def replica_epoch(ds: Any, kind: str, share: bool) -> tuple[float, float, int]:
    """(seconds, validation loss, samples) of one epoch of `Replica.step`, the step a worker runs (the default
    optimizer at P = 2; with `share`, the ISP filter at v = 0.7 too), the batches loaded beforehand."""
    from mlless.spec.config import default_optimizer
    from mlless.training.models import build_model
    from mlless.training.replica import Replica

    batches = _common.all_batches(ds)
    dims = {**ds.dims(), **({"rating_min": ds.manifest.rating_min, "rating_max": ds.manifest.rating_max}
                            if kind == "pmf" else {})}
    model = build_model(kind, dims, seed=0)
    replica = Replica(model, default_optimizer(kind, workers=2), 0.7)
    samples = 0
    with _common.Stopwatch() as sw:
        for step, b in enumerate(np.random.default_rng(0).permutation(len(batches)), start=1):
            samples += replica.step(batches[b], 1, step, share=share).samples
    return sw.seconds, model.loss(*model.evaluate(ds.validation())), samples


def throughput(key: str, ds: Any, data: Path) -> str:
    kind = _common.KINDS[key]
    n = ds.manifest.n_train
    rows = []
    for label, share in (("mlless Replica.step", False), ("mlless Replica.step + ISP filter", True)):
        seconds, loss, samples = replica_epoch(ds, kind, share)
        rows.append((label, seconds, samples / seconds, loss))
    peers = ([_peers.run_libmf(ds, 1, 1), _peers.run_surprise(ds, [1])] if kind == "pmf" else
             [_peers.run_vw(ds, data), _peers.run_sgd_classifier(ds, 1)])
    rows += [(c.system, c.points[-1][0], n / c.points[-1][0], c.points[-1][2]) for c in peers]
    return (f"#### Throughput, one epoch of {_common.ALL_SETS[key].title} ({n:,} training samples)\n\n"
            + _common.table(["system", "seconds", "samples/s", "validation loss"], rows) + "\n")


# ---- the defaults' evidence ---------------------------------------------------------------------------------------------

def candidates(kind: str) -> list[tuple[str, Any, float | None]]:
    """(label, optimizer, l2 or None for the model's default) of the settings tried against the default."""
    from mlless.spec.config import OptimizerConfig as O, default_optimizer

    if kind == "pmf":  # the default: adagrad at lr 0.2 for P <= 2 and 0.4/P above
        return [("adagrad lr 0.2", O(type="adagrad", learning_rate=0.2), None),
                ("adagrad lr 0.1", O(type="adagrad", learning_rate=0.1), None),
                ("adagrad lr 0.05", O(type="adagrad", learning_rate=0.05), None),
                ("adagrad lr 0.2, l2 0.01", O(type="adagrad", learning_rate=0.2), 0.01),
                ("adagrad lr 0.2, l2 0.1", O(type="adagrad", learning_rate=0.2), 0.1),
                ("adam lr 0.01", O(type="adam", learning_rate=0.01), None),
                ("nesterov lr 4, μ 0.8 (papers)", O(type="nesterov", learning_rate=4.0, momentum=0.8), 0.1)]
    return [("adam lr 0.01, lr/√epoch (default)", default_optimizer(kind), None),
            ("adam lr 0.005, lr/√epoch", O(type="adam", learning_rate=0.005, lr_decay="sqrt-epoch"), None),
            ("adam lr 0.03, lr/√epoch", O(type="adam", learning_rate=0.03, lr_decay="sqrt-epoch"), None),
            ("adagrad lr 0.1", O(type="adagrad", learning_rate=0.1), None),
            ("adagrad lr 0.05", O(type="adagrad", learning_rate=0.05), None)]


def simulate(ds: Any, batches: list, kind: str, optimizer: Any, l2: float | None, workers: int, epochs: float,
             target: float, evals_per_epoch: int = 4) -> tuple[float | None, float | None, float]:
    """(epochs to target, seconds to target, best loss) of `workers` replicas in lockstep, as BSP: each starts a step
    from the same parameters, trains on its own mini-batch with its own optimizer state, and the sum of the applied
    updates (each whole, as BSP's filter sends it) is the next step's model. Replica 0 is evaluated
    `evals_per_epoch` times an epoch."""
    from mlless.spec.config import ModelConfig
    from mlless.training.models import build_model
    from mlless.training.optim import Optimizer

    models = [build_model(kind, ds.dims(), ModelConfig(kind, l2=l2), seed=0) for _ in range(workers)]
    cfg = optimizer.replace(weight_decay=models[0].weight_decay)
    optimizers = [Optimizer(m.size, cfg, m.accumulator_size) for m in models]
    val = ds.validation()
    rng = np.random.default_rng(0)
    per_epoch = -(-len(batches) // workers)
    every = max(1, per_epoch // evals_per_epoch)
    order = np.concatenate([rng.permutation(len(batches)) for _ in range(int(np.ceil(epochs)) + 1)])
    seconds, best = 0.0, np.inf
    for step in range(int(epochs * per_epoch)):
        lr = cfg.lr_at(step * workers // len(batches) + 1)
        started = time.perf_counter()
        sent = [opt.update(model, batches[b], lr, workers)[:2]
                for model, opt, b in zip(models, optimizers, order[step * workers:(step + 1) * workers])]
        for p, model in enumerate(models):
            for q, (idx, delta) in enumerate(sent):
                if q != p and len(idx):
                    model.params[idx] += delta
        seconds += time.perf_counter() - started
        if (step + 1) % every == 0:
            loss = models[0].loss(*models[0].evaluate(val))
            best = min(best, loss)
            if loss <= target:
                return (step + 1) / per_epoch, seconds, best
            if not np.isfinite(loss) or loss > 10:
                break
    return None, None, best


def defaults(key: str, ds: Any, data: Path, args: argparse.Namespace) -> str:
    kind = _common.KINDS[key]
    target = _peers.pmf_target(key, ds)[1] if kind == "pmf" else _peers.lr_target(ds, data)[1]
    batches = _common.all_batches(ds)
    rows = []
    for label, optimizer, l2 in candidates(kind):
        for w in [1, 2] if args.quick else [int(x) for x in args.defaults_workers.split(",")]:
            ep, sec, best = simulate(ds, batches, kind, optimizer, l2, w, args.defaults_epochs, target)
            print(f"  {key:<12} {label:<34} P={w}: epochs {ep}, seconds {sec}, best {best:.4f}", flush=True)
            rows.append((label, w, ep, sec, best))
    return (f"#### Choosing the defaults, {_common.ALL_SETS[key].title}: target {target:.4f}\n\nP replicas in "
            f"lockstep in one process (each step: P mini-batches from the same model, the sum of the P applied "
            f"updates), {args.defaults_epochs:g} epochs at most, 4 evaluations per epoch; seconds are the optimizer's "
            "compute time only; '–' = not reached.\n\n"
            + _common.table(["setting", "P", "epochs to target", "seconds to target", "best loss"], rows) + "\n")
