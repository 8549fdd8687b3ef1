#!/usr/bin/env python
"""The ISP filter's cost per step: the timing wheel against the walk it replaced, on one trajectory.

One replica trains PMF with its defaults (P = 2's learning rate, v = 0.7) over a
prepared dataset, and at every step both filters see the same update: the
replica's `SignificanceFilter.step` (what `Replica.step` calls after the
optimizer) and the walk of every pending entry from commit b762214 (`kernels/significance.pyx` as it
was then, built here from git history with setup.py's flags), fed the same
(idx, delta) and the same replica.  Reported per epoch: compute (gradient and
optimizer), each filter's time (accumulate + select), entries sent and pending,
and whether the two selections agreed at every step (they must: same rule).

    python benchmarks/filter_cost.py [--dataset DIR] [--epochs N] [--quick] [--write-results]

The default data is time_to_quality.py's 10M skewed ratings (prepared on first use).
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
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
from time_to_quality import DATASETS  # noqa: E402

WALK_COMMIT = "b762214"
SETUP = """
import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
setup(ext_modules=cythonize([Extension("walk", ["walk.pyx"], include_dirs=[np.get_include()], extra_compile_args=["-O3"])],
      language_level=3, compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True,
                                              "initializedcheck": False}))
"""


def build_walk(work: Path):
    """The walk kernel of WALK_COMMIT, compiled into ``work``."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(["git", "-C", str(root), "show", f"{WALK_COMMIT}:functions/mlless/training/kernels/significance.pyx"],
                            check=True, capture_output=True, text=True).stdout
    (work / "walk.pyx").write_text(source)
    (work / "setup.py").write_text(SETUP)
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=work, check=True, capture_output=True)
    sys.path.insert(0, str(work))
    import walk
    return walk


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR,
                   help="where the default dataset lives / is generated (default %(default)s)")
    p.add_argument("--dataset", type=Path, help="a prepared PMF dataset instead of the 10M skewed ratings")
    p.add_argument("--epochs", type=int, default=2, help="epochs (default 2)")
    p.add_argument("--quick", action="store_true", help="one epoch")
    p.add_argument("--v", type=float, default=0.7, help="ISP threshold (default 0.7)")
    p.add_argument("--write-results", action="store_true", help="refresh this script's section of RESULTS.md")
    args = p.parse_args(argv)
    if args.quick:
        args.epochs = 1
    if args.dataset is None:
        data = DATASETS["pmf10m-skew"]
        args.dataset = _common.prepare(args.data_dir / f"ttq-{data.key}", *data.prepare_args)
    info = _common.machine_info()
    print(_common.machine_line(info), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        walk = build_walk(Path(tmp))
        ds = Dataset.open(str(args.dataset))
        batches = [ds.batch(i) for i in range(ds.n_batches)]
        dims = {**ds.dims(), "rating_min": ds.manifest.rating_min, "rating_max": ds.manifest.rating_max}
        replica = Replica(build_model("pmf", dims, ModelConfig.of("pmf", rank=20), 0), default_optimizer("pmf", 2), args.v)
        size = replica.params.size
        acc, flags, dirty, n_dirty = np.zeros(size, np.float32), np.zeros(size, np.uint8), np.empty(size, np.int32), 0
        rows, step, disagreements = [], 0, 0
        for epoch in range(1, args.epochs + 1):
            compute = wheel = walked = 0.0
            sent = 0
            for b in np.random.default_rng(epoch).permutation(len(batches)):
                step += 1
                started = time.perf_counter()
                # The two halves of Replica.step, taken apart so that the walk sees the same update.
                idx, delta, _, _ = replica.optimizer.update(replica.model, batches[b], replica.config.lr_at(epoch))
                computed = time.perf_counter()
                selected, _ = replica.filter.step(idx, delta, step)
                filtered = time.perf_counter()
                n_dirty = walk.accumulate(acc, flags, dirty, n_dirty, idx, delta)
                w_idx, _, n_dirty = walk.select(acc, flags, dirty, n_dirty, replica.params, args.v / math.sqrt(step), False)
                walked += time.perf_counter() - filtered
                compute += computed - started
                wheel += filtered - computed
                sent += len(selected)
                disagreements += not np.array_equal(np.sort(w_idx), np.sort(selected))
            n = len(batches)
            rows.append((epoch, n, f"{compute / n * 1e3:.2f}", f"{wheel / n * 1e3:.2f}", f"{walked / n * 1e3:.2f}",
                         f"{walked / wheel:.1f}x", f"{wheel / compute:.0%}", f"{sent / n:,.0f}", f"{replica.pending_count():,}"))
            print(f"  epoch {epoch}: compute {compute / n * 1e3:.2f} ms/step, wheel {wheel / n * 1e3:.2f}, walk "
                  f"{walked / n * 1e3:.2f}; sent {sent / n:,.0f}/step, pending {replica.pending_count():,}", flush=True)
    table = _common.table(["epoch", "steps", "compute ms/step", "wheel ms/step", f"walk ({WALK_COMMIT}) ms/step",
                           "wheel speed-up", "wheel / compute", "sent per step", "pending at end"], rows)
    verdict = "every selection identical" if disagreements == 0 else f"{disagreements} steps DISAGREED"
    print("\n" + table + f"\n\n{verdict}")
    if args.write_results:
        body = ["## The ISP filter per step: timing wheel vs walk (`benchmarks/filter_cost.py`)", "",
                f"Run: {_common.machine_line(info)}.", "", "```", _common.command_line(), "```", "",
                f"`{args.dataset.name}`: {ds.manifest.n_train:,} training ratings, batch {ds.manifest.batch_size:,}, "
                f"model {size:,} parameters, v = {args.v:g}; both filters fed the same update at every step: {verdict}.", "",
                table, ""]
        _common.update_results("filter_cost", "\n".join(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
