#!/usr/bin/env python
"""Per-step cost of the ISP filter kernels: the current `select` vs an older one, on identical inputs.

Runs the pmf_throughput loop (gradient + Nesterov + accumulate + select) over a prepared PMF dataset.
At each step the accumulator state is copied and the OLD kernel's `select` is timed on the copy, then
the current one on the real state, so both see the same inputs and the trajectory is the current
library's. Prints pending-list density, per-step times and how often the two disagree on the number of
entries sent. Used for library problem 1 in RESULTS.md.

Build the old kernel first (here `f9fd501`, before the dense pass), with the flags of setup.py:

    mkdir -p /tmp/oldsig && cd /tmp/oldsig
    git -C /work/main show f9fd501:functions/mlless/kernels/significance.pyx > oldsig.pyx
    cythonize -i -X boundscheck=False -X wraparound=False -X cdivision=True -X initializedcheck=False \\
        -3 oldsig.pyx            # or a setup.py with extra_compile_args=["-O3"], as RESULTS.md did
    python benchmarks/select_kernel.py /tmp/mlless-bench/movielens-small 5 --old-dir /tmp/oldsig
"""
import argparse
import sys
import time
import numpy as np
from mlless.data.dataset import Dataset
from mlless.models import ModelConfig, build_model
from mlless.optim import default_optimizer, make_optimizer
from mlless.significance import SignificanceFilter, isp_threshold

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("dataset", help="directory written by mlless prepare (PMF)")
p.add_argument("epochs", type=int)
p.add_argument("--old-dir", default="/tmp/oldsig", help="directory holding the built oldsig module")
args = p.parse_args()
sys.path.insert(0, args.old_dir)
import oldsig as oldk  # noqa: E402

path, epochs = args.dataset, args.epochs

ds = Dataset.open(path)
batches = [ds.batch(i) for i in range(ds.n_batches)]
dims = {**ds.dims(), "rating_min": ds.manifest.rating_min, "rating_max": ds.manifest.rating_max}
model = build_model("pmf", dims, ModelConfig("pmf", rank=20), 0)
cfg = default_optimizer("pmf")
opt = make_optimizer(model.size, cfg.replace(weight_decay=model.weight_decay), model.accumulator_size)
f = SignificanceFilter(model.size)
rng = np.random.default_rng(0)
t_acc = t_new = t_old = t_grad = 0.0
pend, dense, step, mism = [], 0, 0, 0
for e in range(epochs):
    lr = cfg.lr_at(e + 1)
    for b in rng.permutation(len(batches)):
        t0 = time.perf_counter()
        idx, delta, _, _ = opt.update(model, batches[b], lr)
        t1 = time.perf_counter()
        f.accumulate(idx, delta)
        t2 = time.perf_counter()
        step += 1
        thr = isp_threshold(0.7, step)
        acc, flags, dirty, nd = f._acc.copy(), f._flags.copy(), f._dirty.copy(), f._n_dirty
        t3 = time.perf_counter()
        oi, ov, ok = oldk.select(acc, flags, dirty, nd, model.params, thr, False)
        t4 = time.perf_counter()
        ni, nv = f.select(model.params, thr)
        t5 = time.perf_counter()
        t_grad += t1 - t0; t_acc += t2 - t1; t_old += t4 - t3; t_new += t5 - t4
        pend.append(nd); dense += nd * 8 > model.size
        mism += len(ni) != len(oi)
print(f"{path}: model {model.size:,} entries, {step} steps, pending before select median {int(np.median(pend)):,} "
      f"({np.median(pend) / model.size:.0%}), dense pass in {dense / step:.0%} of steps; steps where old/new sent counts differ: {mism}")
print(f"per step: gradient+optimizer {t_grad / step * 1e3:.3f} ms, accumulate {t_acc / step * 1e3:.3f} ms, "
      f"select NEW {t_new / step * 1e3:.3f} ms, select OLD(f9fd501) {t_old / step * 1e3:.3f} ms")
