#!/usr/bin/env python
"""Adam against the normalized updates under the sum of P replicas' updates, on clicks as prepared and as given.

Each candidate trains in this process with the code a worker runs (`defaults.simulate`: `Optimizer.update` with
the job's P, then `SignificanceFilter.step` at LR's ISP threshold): P replicas in lockstep, each with its own
optimizer state and filter, each adding what its peers' filters sent. So the table isolates the optimizer, P and
ISP's staleness, without process or transport costs (`scaling.py` measures those). Replica 0 is evaluated 8 times
an epoch.

Two variants of the same 1M synthetic clicks (`time_to_quality.py`'s "lr"): ``log1p`` as `mlless prepare` gives
them, and ``raw``, whose 13 integer columns carry the values a user has (counts up to 10^4, clock times up to
2359, distances up to 5,000: expm1 of the prepared ones). The target is Vowpal Wabbit's one-pass validation BCE
+ 0.005 on the same variant, VW timed on its pass.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import defaults  # noqa: E402
import time_to_quality as ttq  # noqa: E402

from mlless.data.batches import SparseBatch  # noqa: E402
from mlless.data.dataset import Dataset  # noqa: E402
from mlless.data.formats import CRITEO_INT_COLUMNS  # noqa: E402
from mlless.spec.config import OptimizerConfig  # noqa: E402
from mlless.spec.models import TYPE_LEARNING_RATES, model_type  # noqa: E402

KIND = "logistic-regression"
CANDIDATES = {c.label: c for c in (
    defaults.Candidate("adam 0.01 lr/√epoch", OptimizerConfig(type="adam", learning_rate=0.01, lr_decay="sqrt-epoch")),
    defaults.Candidate("normalized 0.5", OptimizerConfig(type="normalized",
                                                         learning_rate=TYPE_LEARNING_RATES["normalized"])),
)}


def raw(batch: SparseBatch) -> SparseBatch:
    """The batch with its integer columns as given: expm1 of `prepare`'s log1p."""
    values = batch.values.copy()
    ints = batch.indices < CRITEO_INT_COLUMNS
    values[ints] = np.expm1(values[ints])
    return SparseBatch(batch.indptr, batch.indices, values, batch.labels)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR, help="prepared data (default %(default)s)")
    p.add_argument("--variants", default="log1p,raw", help="comma list of %(default)s")
    p.add_argument("--candidates", default=",".join(CANDIDATES), help="comma list of %(default)s")
    p.add_argument("--workers", default="1,2,4", help="comma list of P (default %(default)s)")
    p.add_argument("--epochs", type=float, default=3, help="epochs at most per run (default %(default)s)")
    p.add_argument("--v", type=float, default=model_type(KIND).significance_threshold,
                   help="ISP's threshold (default LR's, %(default)s)")
    p.add_argument("--write-results", action="store_true", help="refresh this script's section of RESULTS.md")
    args = p.parse_args(argv)
    info = _common.machine_info()
    print(_common.machine_line(info), flush=True)
    spec = ttq.DATASETS["lr"]
    data = _common.prepare(args.data_dir / "ttq-lr", *spec.prepare_args)
    ds = Dataset.open(str(data))
    rows = []
    for variant in args.variants.split(","):
        batches = [ds.batch(i) for i in range(ds.n_batches)]
        val = ds.validation()
        if variant == "raw":
            batches, val = [raw(b) for b in batches], raw(val)
        vw_bce, vw_seconds = ttq.vw_pass(batches, val, data / f"vw-{variant}")
        target = vw_bce + 0.005
        print(f"{variant}: VW {vw_bce:.4f} in {vw_seconds:.2f} s, target {target:.4f}", flush=True)
        rows.append((variant, f"{target:.4f}", "Vowpal Wabbit, 1 pass", "–", 1, f"{vw_seconds:.2f}", f"{vw_bce:.4f}"))
        for label in args.candidates.split(","):
            for workers in (int(w) for w in args.workers.split(",")):
                ep, sec, best = defaults.simulate(ds, batches, KIND, CANDIDATES[label], workers, args.epochs, target,
                                                  evals_per_epoch=8, v=args.v, val=val)
                print(f"  {label:<22} P={workers}: epochs {ep}, seconds {sec}, best {best:.4f}", flush=True)
                rows.append((variant, f"{target:.4f}", label, workers, "–" if ep is None else f"{ep:.2f}",
                             "–" if sec is None else f"{sec:.2f}", f"{best:.4f}"))
    body = "\n".join([
        "### Adam against the normalized updates under the sum of updates (`benchmarks/normalized_pace.py`)",
        "",
        f"Machine: {_common.machine_line(info)}. Command: `{_common.command_line()}`.",
        "",
        f"P ISP replicas (v = {args.v:g}) in lockstep in one process, {args.epochs:g} epochs at most, 8 evaluations "
        "an epoch; seconds are the replicas' summed compute (VW's: its pass). '–' = not reached.",
        "",
        _common.table(["columns", "target", "optimizer", "P", "epochs to target", "seconds to target", "best BCE"], rows),
    ])
    if args.write_results:
        _common.update_results("normalized_pace", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
