#!/usr/bin/env python
"""In-store aggregation vs all-to-all vs AllReduce (issue #25, item 4): bytes read per worker and time per step.

SPIRT (`../shared/papers/`, `003_1a28dde80451cee8.txt`) averages inside Redis and reports averaging up to 82 % faster.
Here `in-store` (`sync/exchanges/instore.py`: a Lua script in Redis merges a step's updates, every worker reads the
one merged frame) runs against all-to-all and AllReduce with `benchmarks/exchange_size.py`'s harness: P worker
processes over Redis + RabbitMQ, each publishing the same update every step, a barrier for the close, `gather`,
the models' kernel to apply, and the conservation check. Two kinds of update:

- dense: every parameter of a small model (16 KB and 256 KB of float32), as a dense model's step;
- sparse: 1 % of a 4 MB model (10,486 of 1,048,576 parameters, spread at random), as a hashed LR's step.

It also times the script alone (`script_cost`): three contributions of n entries merged in one EVALSHA, then the
kept record read again, in one process, which is what Redis spends per step and blocks its other clients for.

With `--jobs`, it runs `mlless train` instead: PMF on the MovieLens sample under BSP for 40 steps at P = 2-4, with
each pattern, and reports the validation loss, the seconds per step and the bytes read per worker-step.

    python benchmarks/instore.py [--workers 2,3,4] [--jobs] [--write-results]
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import exchange_size  # noqa: E402

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from mlless.sync.exchanges.instore import InStore  # noqa: E402
from mlless.transport import connect  # noqa: E402

#: (label, parameters, density, steps)
CASES = (("dense 16 KB", 4096, 1.0, 20), ("dense 256 KB", 65536, 1.0, 5), ("sparse 1 % of 4 MB", 1 << 20, 0.01, 10))
PATTERNS = ("all-to-all", "allreduce", "in-store")


def script_cost(entries: int, dense: bool) -> tuple[float, float]:
    """Seconds of the first (merging) and second (kept record) script run of a step of three workers' updates
    of `entries` entries each."""
    job = f"instore-bench-{uuid.uuid4().hex[:8]}"
    size = 4 * entries if dense else 100 * entries
    key = secrets.token_bytes(32)
    transports = [connect(job, role="worker", rank=r, key=key, redis_url=_common.REDIS, amqp_url=_common.AMQP)
                  for r in range(3)]
    try:
        rng = np.random.default_rng(0)
        exchanges = [InStore(t, t.rank, lambda r, s: f"update:{r}:{s % 2}", 2, 30.0, print, size=size, parts=3)
                     for t in transports]
        for w in exchanges:
            start = int(rng.integers(0, size - entries))
            idx = (np.arange(start, start + entries) if dense
                   else np.sort(rng.choice(size, entries, replace=False))).astype(np.int32)
            w.publish(1, idx, rng.standard_normal(entries).astype(np.float32))
        times = []
        for w in exchanges[:2]:
            t0 = time.perf_counter()
            assert w.merged(1, [0, 1, 2])[0] is not None
            times.append(time.perf_counter() - t0)
        return times[0], times[1]
    finally:
        transports[0].delete_job()
        for t in transports:
            t.close()


def job_run(data: Path, out: Path, workers: int, pattern: str) -> list[object]:
    """`mlless train` of PMF under BSP with `pattern`: a row of the jobs' table."""
    spec = {"workers": workers, "model": {"type": "pmf"}, "dataset": {"uri": str(data), "cacheBatches": True},
            "sync": {"protocol": "bsp", "exchange": pattern}, "stop": {"maxSteps": 40}}
    job = out / f"{pattern}-{workers}.yaml"
    job.write_text(yaml.safe_dump({"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob",
                                   "metadata": {"name": f"instore-{workers}"}, "spec": spec}))
    run = _common.mlless_train(job, out / job.stem, services=True)
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    read = [r["bytes_read"] for r in rows if r.get("bytes_read")]
    return [workers, pattern, summary["validation_loss"], summary["wall_seconds"] / summary["steps"],
            statistics.median(read) / workers / 1e3, summary["rejected_frames"]]


def jobs(args: argparse.Namespace, info: dict[str, str]) -> str:
    data = _common.prepare(_common.DEFAULT_DATA_DIR / "movielens-small", "--sample", "movielens-small")
    body = []
    with tempfile.TemporaryDirectory(prefix="instore-") as tmp:
        for workers in map(int, args.workers.split(",")):
            for pattern in PATTERNS:
                body.append(job_run(data, Path(tmp), workers, pattern))
                print(body[-1], flush=True)
    return "\n".join([f"Run: `{_common.command_line()}`; {_common.machine_line(info)}; load average at the end "
                      f"{_common.loadavg()}.", "",
                      "PMF, MovieLens sample, BSP, 40 steps, Redis + RabbitMQ on loopback: the validation RMSE at the "
                      "end, the job's wall seconds per step (start-up included), the median kB read per worker-step, "
                      "and the frames rejected.", "",
                      _common.table(["P", "exchange", "validation RMSE", "s per step", "kB read per worker-step",
                                     "rejected"], body), ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="2,3,4", help="worker counts P")
    parser.add_argument("--jobs", action="store_true", help="time whole `mlless train` jobs instead")
    parser.add_argument("--write-results", action="store_true", help="replace this script's section of RESULTS.md")
    args = parser.parse_args()
    info = _common.machine_info()
    if args.jobs:
        text = jobs(args, info)
        print(text)
        if args.write_results:
            _common.update_results("instore-jobs", text)
        return
    # Kept small: Redis serves nothing else while it merges, and this Redis may be shared.
    costs = [(entries, dense, *script_cost(entries, dense)) for entries in (10_000, 30_000) for dense in (True, False)]
    rows = []
    for label, params, density, steps in CASES:
        for workers in map(int, args.workers.split(",")):
            for pattern in PATTERNS:
                row = exchange_size.run(pattern, workers, params, "services", None, steps, density)
                rows.append({**row, "case": label})
                print(f"{label} P={workers} {pattern}: exchange {row['exchange']:.4f} s, read "
                      f"{row['read'] / 1e6:.4f} MB, conserved {row['conserved']}", flush=True)
    lines = [f"Run: `{_common.command_line()}`; {_common.machine_line(info)}; load average at the end "
             f"{_common.loadavg()}.", "",
             "Median seconds per worker-step of `exchange_size.py`'s harness (publish, wait for peers at the barrier, "
             "gather, apply; `exchange` = publish + gather + apply), and MB written and read per worker-step (mean "
             "over workers; the busiest reader in brackets); `ok` is the conservation check.", ""]
    body = [[r["case"], r["workers"], r["pattern"], r["publish"], r["wait"], r["gather"], r["apply"], r["exchange"],
             r["written"] / 1e6, f"{r['read'] / 1e6:.4f} ({r['read_max'] / 1e6:.4f})",
             "yes" if r["conserved"] else f"NO ({r['error']:.2g})"] for r in rows]
    lines += [_common.table(["update", "P", "exchange", "publish s", "wait s", "gather s", "apply s", "exchange s",
                             "MB written", "MB read", "ok"], body), ""]
    lines += ["The script alone: one step of 3 contributions of n entries each (3n entries added), merged by the "
              "first EVALSHA and read back by the second.", ""]
    lines += [_common.table(["n", "indices", "merge s", "µs per entry added", "kept record s"],
                            [[entries, "one run" if dense else "spread", first, 1e6 * first / (3 * entries), again]
                             for entries, dense, first, again in costs]), ""]
    text = "\n".join(lines)
    print(text)
    if args.write_results:
        _common.update_results("instore", text)


if __name__ == "__main__":
    main()
