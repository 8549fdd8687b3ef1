#!/usr/bin/env python
"""PMF training throughput on one core: mlless vs LIBMF vs scikit-surprise SVD vs PyTorch (dense embeddings).

For each dataset (the MovieLens sample and synthetic ML-10M-sized ratings), every
system trains rank-20 biased MF for the same number of epochs over the same
training split, and is evaluated on the same validation split (predictions
clipped to the dataset's rating range for every system).

mlless rows call `Replica.step`, the step a worker runs, with the default
optimizer (per-sample AdaGrad, lr 0.2 at P = 2):
  * "mlless (gradient+optimizer)": `share=False`, as a worker alone in its job;
  * "mlless (+ ISP filter)": the accumulate and the timing-wheel selection too, with
    v_t = 0.7/sqrt(t), i.e. the whole local computation of a worker among peers.
    Its "filter / compute" column is the median per-step ratio of the two phases
    (`StepResult.filter_seconds / compute_seconds`).
  Batches are loaded into memory before timing (a worker prefetches them in a
  background thread), so neither row includes I/O.

Baselines:
  * LIBMF (PyPI `libmf`), 1 thread, rank 20, L2 0.05 on P and Q and no L1 (the
    binding's default L1 zeroes most factors), on the same training ratings
    minus their mean; it shuffles and blocks them itself;
  * surprise `SVD(n_factors=20, n_epochs=E)` (per-rating SGD, its own lr/reg defaults);
  * PyTorch CPU, `torch.set_num_threads(1)`, dense `nn.Embedding` factors + biases,
    MSE loss, `SGD(lr=4.0, momentum=0.8, nesterov=True)` (the papers' PMF optimizer), the same
    batches in the same order.

Throughput = training ratings processed / seconds (wall and process CPU time).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

_common.single_thread_env()

import numpy as np  # noqa: E402

from mlless.data.dataset import Dataset  # noqa: E402
from mlless.spec.config import ModelConfig  # noqa: E402
from mlless.training.models import build_model  # noqa: E402
from mlless.spec.config import default_optimizer  # noqa: E402
from mlless.training.replica import Replica  # noqa: E402

RANK = 20


def load(path: Path):
    ds = Dataset.open(str(path))
    batches = [ds.batch(i) for i in range(ds.n_batches)]
    return ds, batches, ds.validation()


def orders(n_batches: int, epochs: int, seed: int) -> list[np.ndarray]:
    return [np.random.default_rng(seed + e).permutation(n_batches) for e in range(epochs)]


def rmse(pred: np.ndarray, truth: np.ndarray, lo: float, hi: float) -> float:
    err = np.clip(pred.astype(np.float64), lo, hi) - truth.astype(np.float64)
    return math.sqrt(float(err @ err) / len(err))


# ------------------------------------------------------------------------------------ mlless

def run_mlless(ds, batches, val, epochs, seed, with_filter: bool, v: float = 0.7):
    dims = {**ds.dims(), "rating_min": ds.manifest.rating_min, "rating_max": ds.manifest.rating_max}
    model = build_model("pmf", dims, ModelConfig.of("pmf", rank=RANK), seed)
    replica = Replica(model, default_optimizer("pmf", workers=2), v)
    plan = orders(len(batches), epochs, seed)
    n = step = sent = 0
    ratios = []
    with _common.Stopwatch() as sw:
        for e, order in enumerate(plan):
            for b in order:
                step += 1
                result = replica.step(batches[b], e + 1, step, share=with_filter)
                sent += len(result.indices)
                n += result.samples
                ratios.append(result.filter_seconds / result.compute_seconds)
    pred = model.predict(val)
    return {"seconds": sw.seconds, "cpu": sw.cpu_seconds, "ratings": n,
            "rmse": rmse(pred, val.ratings, ds.manifest.rating_min, ds.manifest.rating_max),
            "sent_per_step": sent / step if with_filter else None,
            "filter_share": statistics.median(ratios) if with_filter else None}


# ------------------------------------------------------------------------------------ LIBMF

def run_libmf(ds, batches, val, epochs, seed):
    with contextlib.redirect_stdout(io.StringIO()):  # the binding prints where it found its .so
        from libmf import mf
    u = np.concatenate([b.users for b in batches])
    i = np.concatenate([b.items for b in batches])
    r = np.concatenate([b.ratings for b in batches])
    mean = float(r.mean())
    X = np.ascontiguousarray(np.stack([u, i, r - mean], 1).astype(np.float32))
    model = mf.MF(k=RANK, nr_threads=1, nr_iters=epochs, lambda_p1=0.0, lambda_q1=0.0, lambda_p2=0.05,
                  lambda_q2=0.05, quiet=True)
    with _common.Stopwatch() as sw:
        model.fit(X)
    # The binding's predict returns garbage (benchmarks/time_to_quality.py), so predictions come from P and Q.
    P, Q = model.p_factors(), model.q_factors()
    known = (val.users < len(P)) & (val.items < len(Q))
    pred = np.full(len(val), mean, np.float32)
    pred[known] += np.einsum("ij,ij->i", P[val.users[known]], Q[val.items[known]])
    return {"seconds": sw.seconds, "cpu": sw.cpu_seconds, "ratings": len(r) * epochs,
            "rmse": rmse(pred, val.ratings, ds.manifest.rating_min, ds.manifest.rating_max)}


# ------------------------------------------------------------------------------------ surprise

def run_surprise(ds, batches, val, epochs, seed):
    from collections import defaultdict

    from surprise import SVD, Trainset

    users = np.concatenate([b.users for b in batches])
    items = np.concatenate([b.items for b in batches])
    ratings = np.concatenate([b.ratings for b in batches]).astype(np.float64)
    ur: defaultdict[int, list] = defaultdict(list)
    ir: defaultdict[int, list] = defaultdict(list)
    for u, i, r in zip(users.tolist(), items.tolist(), ratings.tolist()):
        ur[u].append((i, r))
        ir[i].append((u, r))
    n_users, n_items = ds.manifest.n_users, ds.manifest.n_items
    lo, hi = ds.manifest.rating_min, ds.manifest.rating_max
    # inner ids == our re-indexed ids, so the learnt arrays line up with the validation ids
    trainset = Trainset(ur, ir, n_users, n_items, len(ratings), (lo, hi),
                        {u: u for u in range(n_users)}, {i: i for i in range(n_items)})
    del users, items, ratings
    algo = SVD(n_factors=RANK, n_epochs=epochs, random_state=seed)
    with _common.Stopwatch() as sw:
        algo.fit(trainset)
    u, i = val.users, val.items
    pred = trainset.global_mean + algo.bu[u] + algo.bi[i] + np.einsum("ij,ij->i", algo.pu[u], algo.qi[i])
    return {"seconds": sw.seconds, "cpu": sw.cpu_seconds, "ratings": trainset.n_ratings * epochs,
            "rmse": rmse(pred, val.ratings, lo, hi)}


# ------------------------------------------------------------------------------------ torch

def run_torch(ds, batches, val, epochs, seed, l2: float = 0.0):
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    n_users, n_items = ds.manifest.n_users, ds.manifest.n_items
    mean = float(ds.manifest.mean_rating)

    class MF(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.U = nn.Embedding(n_users, RANK)
            self.M = nn.Embedding(n_items, RANK)
            self.bu = nn.Embedding(n_users, 1)
            self.bi = nn.Embedding(n_items, 1)
            for emb in (self.U, self.M):
                nn.init.normal_(emb.weight, 0.0, 0.1)
            for emb in (self.bu, self.bi):
                nn.init.zeros_(emb.weight)

        def forward(self, u, i):
            pu, qi, bu, bi = self.U(u), self.M(i), self.bu(u).squeeze(1), self.bi(i).squeeze(1)
            return (pu * qi).sum(1) + bu + bi + mean, (pu, qi, bu, bi)

    model = MF()
    opt = torch.optim.SGD(model.parameters(), lr=4.0, momentum=0.8, nesterov=True)
    tb = [(torch.from_numpy(b.users.astype(np.int64)), torch.from_numpy(b.items.astype(np.int64)),
           torch.from_numpy(b.ratings)) for b in batches]
    plan = orders(len(batches), epochs, seed)
    n = 0
    with _common.Stopwatch() as sw:
        for order in plan:
            for b in order:
                u, i, r = tb[b]
                pred, parts = model(u, i)
                loss = ((pred - r) ** 2).mean()
                if l2:
                    pu, qi, bu, bi = parts
                    loss = loss + l2 * ((pu * pu).sum(1) + (qi * qi).sum(1) + bu * bu + bi * bi).mean()
                opt.zero_grad(set_to_none=False)
                loss.backward()
                opt.step()
                n += len(r)
    with torch.no_grad():
        pred, _ = model(torch.from_numpy(val.users.astype(np.int64)), torch.from_numpy(val.items.astype(np.int64)))
    ok = bool(torch.isfinite(pred).all())
    return {"seconds": sw.seconds, "cpu": sw.cpu_seconds, "ratings": n,
            "rmse": rmse(pred.numpy(), val.ratings, ds.manifest.rating_min, ds.manifest.rating_max) if ok
            else float("nan")}


# ------------------------------------------------------------------------------------ driver

def bench(name, path, epochs, seed, repeat, systems, torch_l2):
    """One dataset: every system once (mlless rows `repeat` times, lowest CPU time kept)."""
    ds, batches, val = load(path)
    bs = ds.manifest.batch_size
    print(f"\n== {name}: {ds.manifest.n_train:,} train / {ds.manifest.n_validation:,} validation ratings, "
          f"{ds.manifest.n_users:,} users x {ds.manifest.n_items:,} items, batch {bs}, {epochs} epochs "
          f"(load {_common.loadavg()})", flush=True)
    results = []

    def record(label, runs):
        best = min(runs, key=lambda r: r["cpu"])
        res = {"system": label, **best, "wall_rps": best["ratings"] / best["seconds"],
               "cpu_rps": best["ratings"] / best["cpu"], "load": _common.loadavg(), "runs": len(runs)}
        if len(runs) > 1:
            res["wall_rps_median"] = statistics.median(r["ratings"] / r["seconds"] for r in runs)
        results.append(res)
        share = f"  filter/compute {res['filter_share']:.0%}" if res.get("filter_share") is not None else ""
        print(f"  {label:34s} {res['wall_rps']:>14,.0f} ratings/s (wall)  {res['cpu_rps']:>14,.0f} (cpu)  "
              f"{res['seconds']:7.2f}s  val RMSE {res['rmse']:.4f}  load {res['load']}{share}", flush=True)

    if "mlless" in systems:
        record("mlless (gradient+optimizer)", [run_mlless(ds, batches, val, epochs, seed, False) for _ in range(repeat)])
        record("mlless (+ ISP filter, v=0.7)", [run_mlless(ds, batches, val, epochs, seed, True) for _ in range(repeat)])
    if "libmf" in systems:
        record("LIBMF, 1 thread", [run_libmf(ds, batches, val, epochs, seed) for _ in range(repeat)])
    if "surprise" in systems:
        record("surprise SVD", [run_surprise(ds, batches, val, epochs, seed)])
    if "torch" in systems:
        record("PyTorch dense (MSE)", [run_torch(ds, batches, val, epochs, seed)])
        if torch_l2:
            record(f"PyTorch dense (MSE + l2 {torch_l2:g})", [run_torch(ds, batches, val, epochs, seed, torch_l2)])
    return {"name": name, "batch": bs, "epochs": epochs, "n_train": ds.manifest.n_train,
            "n_validation": ds.manifest.n_validation, "results": results}


def speedups(block):
    by = {r["system"]: r for r in block["results"]}
    out = []
    for ml in ("mlless (gradient+optimizer)", "mlless (+ ISP filter, v=0.7)"):
        for base, target in (("LIBMF, 1 thread", 1.0), ("surprise SVD", 3.0), ("PyTorch dense (MSE)", 5.0)):
            if ml in by and base in by:
                w = by[ml]["wall_rps"] / by[base]["wall_rps"]
                c = by[ml]["cpu_rps"] / by[base]["cpu_rps"]
                d_rmse = by[ml]["rmse"] - by[base]["rmse"]
                met = "met" if min(w, c) >= target and d_rmse <= 0.01 else "MISSED"
                out.append((block["name"], ml, base, f"{w:.1f}x", f"{c:.1f}x", f"≥ {target:g}x",
                            f"{d_rmse:+.4f}", met))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR,
                   help="where prepared datasets live / are generated (default %(default)s)")
    p.add_argument("--epochs-sample", type=int, default=20, help="epochs on the MovieLens sample (default 20)")
    p.add_argument("--epochs-large", type=int, default=5, help="epochs on the ML-10M-sized data (default 5)")
    p.add_argument("--rows", type=int, default=10_000_000, help="rows of the synthetic large dataset (default 10M)")
    p.add_argument("--repeat", type=int, default=3, help="runs of each mlless row on the sample (1 on the large data); lowest CPU time kept (default 3)")
    p.add_argument("--systems", default="mlless,libmf,surprise,torch", help="comma list (default all)")
    p.add_argument("--torch-l2", type=float, default=0.1,
                   help="on the sample, also run PyTorch with mlless' per-rating L2 term (default 0.1 = mlless' "
                        "default l2; 0 = skip)")
    p.add_argument("--skip-large", action="store_true", help="only the MovieLens sample")
    p.add_argument("--systems-large", help="comma list for the large data (default: --systems), e.g. mlless,surprise to skip PyTorch's ~6 min there")
    p.add_argument("--quick", action="store_true", help="sample only, 5 epochs, 1 repeat")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--write-results", action="store_true", help="refresh this script's section of RESULTS.md")
    args = p.parse_args(argv)
    if args.quick:
        args.skip_large, args.epochs_sample, args.repeat = True, 5, 1
    systems = set(args.systems.split(","))
    systems_large = set(args.systems_large.split(",")) if args.systems_large else systems
    info = _common.machine_info()
    print(_common.machine_line(info))

    sample = _common.prepare(args.data_dir / "movielens-small", "--sample", "movielens-small")
    blocks = [bench("MovieLens sample", sample, args.epochs_sample, args.seed, args.repeat, systems, args.torch_l2)]
    large_cmd = None
    if not args.skip_large:
        name = "pmf-10m" if args.rows == 10_000_000 else f"pmf-{args.rows}"
        large_args = ("--synthetic", "pmf", "--rows", str(args.rows), "--users", "70000", "--items", "10000",
                      "--batch-size", "6250")
        large_cmd = "mlless prepare " + " ".join(large_args)
        large = _common.prepare(args.data_dir / name, *large_args)
        blocks.append(bench(f"synthetic {args.rows / 1e6:g}M (ML-10M-sized)", large, args.epochs_large, args.seed,
                            1, systems_large, 0.0))

    rows = []
    for blk in blocks:
        for r in blk["results"]:
            share = f"{r['filter_share']:.0%}" if r.get("filter_share") is not None else "–"
            rows.append((blk["name"], f"{blk['batch']:,}", blk["epochs"], r["system"], r["wall_rps"], r["cpu_rps"],
                         r["seconds"], r["rmse"], share, r["load"]))
    t1 = _common.table(["data", "batch", "epochs", "system", "ratings/s (wall)", "ratings/s (CPU)", "train s",
                        "val RMSE", "filter / compute (median step)", "load avg after"], rows)
    t2 = _common.table(["data", "mlless path", "vs", "speed-up (wall)", "speed-up (CPU)", "target",
                        "Δ RMSE (mlless − baseline)", "target met?"], [s for b in blocks for s in speedups(b)])
    print("\n" + t1 + "\n\n" + t2)
    if args.write_results:
        body = ["## 1. PMF throughput (`benchmarks/pmf_throughput.py`)", "",
                f"Run: {_common.machine_line(info)}.", "",
                "```", _common.command_line(), "mlless prepare --sample movielens-small   # batch 1000 (the sample's default)"]
        if large_cmd:
            body.append(large_cmd + "   # batch 6250 (paper)")
        body += ["```", "", t1, "", t2, ""]
        _common.update_results("pmf_throughput", "\n".join(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
