#!/usr/bin/env python
"""All-to-all vs AllReduce vs ScatterReduce as a dense model grows (issue #21, LambdaML's comparison).

LambdaML (`../shared/papers/`, `001_e71b59fe3f6420de.txt`) found ScatterReduce ahead of AllReduce for large models:
AllReduce's one reducer reads every peer's whole update and every worker then reads its one merged frame, while
ScatterReduce spreads the merging over the P workers. Here a dense model's step is what a dense logistic regression
publishes after a mini-batch: every parameter. The script times the exchange of such an update, with the patterns'
own code (`sync/exchanges/base.py`, `sync/exchanges/reduce.py`) and the real transports, as the parameter count
grows from 256 (1 KB of float32) to 22.5 million (90 MB):

- P worker processes, each with its own transport connection and its float32 replica, as the models keep it;
- each step: `publish` the worker's update, wait for every peer's (a `multiprocessing.Barrier` stands in for the
  supervisor's close, the same for every pattern), `gather` the close's updates, and add them to the replica with
  the models' kernel (`optim.scatter_add`, as `Model.apply_update`);
- computing the gradient is left out: it is the same for every pattern, and this compares the patterns.

Per worker-step it reports the median seconds of publish, wait, gather and apply and their sum, the bytes written
and read, and checks conservation: after the steps every replica must equal the sum of all workers' updates (up to
float32 rounding of the merged frames); a run that does not is reported as failed.

    python benchmarks/exchange_size.py [--sizes 1KB,1MB,90MB] [--workers 2,3,4] [--transports services,embedded]
                                       [--exchanges all-to-all,allreduce,scatter-reduce] [--write-results]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import re
import secrets
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

_common.single_thread_env()

import numpy as np  # noqa: E402

from mlless.protocol.identity import SUPERVISOR  # noqa: E402
from mlless.protocol.messages import Close  # noqa: E402
from mlless.sync.exchanges.base import EXCHANGES  # noqa: E402
from mlless.training.kernels import optim  # noqa: E402
from mlless.transport import connect  # noqa: E402
from mlless.transport.embedded_broker import EmbeddedBroker  # noqa: E402

PHASES = ("publish", "wait", "gather", "apply")
DEFAULT_SIZES = ("1KB", "16KB", "256KB", "4MB", "16MB", "90MB")
UNITS = {"KB": 1 << 10, "MB": 1 << 20}


def parse_size(text: str) -> int:
    """'90MB' as a parameter count: bytes of float32 values."""
    match = re.fullmatch(r"(\d+)(KB|MB)", text.strip())
    if not match:
        raise SystemExit(f"--sizes: {text!r} is not a size such as 16KB or 90MB")
    return int(match[1]) * UNITS[match[2]] // 4


def steps_for(params: int) -> int:
    """Enough steps for a median, fewer for the big models (a 90 MB step moves hundreds of MB)."""
    return int(np.clip(2e7 // max(params, 1), 3, 20))


def update_of(rank: int, params: int, density: float) -> tuple[np.ndarray, np.ndarray]:
    """The update worker `rank` publishes every step: every parameter, or a random `density` of them (sorted)."""
    rng = np.random.default_rng(rank)
    values = rng.standard_normal(params).astype(np.float32) * 1e-3
    if density >= 1:
        return np.arange(params, dtype=np.int32), values
    indices = np.sort(rng.choice(params, max(int(params * density), 1), replace=False)).astype(np.int32)
    return indices, values[:len(indices)]


def worker(rank: int, workers: int, pattern: str, params: int, steps: int, job: str, key: bytes,
           address: dict[str, str], barrier, results, density: float = 1.0) -> None:  # type: ignore[no-untyped-def]
    transport = connect(job, role="worker", rank=rank, key=key, **address)
    rejected: list[str] = []
    exchange = EXCHANGES.named(pattern)(transport, rank, lambda r, s: f"update:{r}:{s % 2}", 2, 60.0, rejected.append,
                                  size=params, parts=workers)
    indices, values = update_of(rank, params, density)
    replica, marks = np.zeros(params, np.float32), np.zeros(params, np.uint8)
    ranks = tuple(range(workers))
    times: dict[str, list[float]] = {p: [] for p in PHASES}
    written = read = 0
    for step in range(steps + 1):  # step 0 warms the connections up and is not counted
        t0 = time.perf_counter()
        replica[indices] += values  # the worker's own step, already in its replica
        out = exchange.publish(step, indices, values)
        t1 = time.perf_counter()
        barrier.wait()
        t2 = time.perf_counter()
        updates = exchange.gather(Close(sender=SUPERVISOR, step=step, cursor=0, flags=0, live=ranks, updates=ranks, merges=()))
        t3 = time.perf_counter()
        for update in updates:
            if optim.scatter_add(replica, update.indices, update.values, marks) >= 0:
                rejected.append(f"bad index in the update of {update.sender}")
        t4 = time.perf_counter()
        merged, got = exchange.traffic()
        if step:
            for phase, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                times[phase].append(seconds)
            written, read = written + out + merged, read + got
        barrier.wait()  # no worker overwrites a slot of step s + 2 while a peer still reads step s
    expected = np.zeros(params)
    for r in ranks:
        idx, val = update_of(r, params, density)
        expected[idx] += (steps + 1) * val.astype(np.float64)
    # float32 rounding: each of the (steps + 1) * P additions to the replica, and of the merged sums, is within an
    # ulp of the running value, so the replica is within that many ulps of the largest value
    bound = 4 * (steps + 1) * workers * np.finfo(np.float32).eps * float(np.max(np.abs(expected)))
    error = float(np.max(np.abs(replica - expected)))
    results.put({"rank": rank, "times": times, "written": written / steps, "read": read / steps,
                 "error": error, "conserved": error <= bound and not rejected})
    transport.close()


def run(pattern: str, workers: int, params: int, transport: str, broker: EmbeddedBroker | None,
        steps: int, density: float = 1.0) -> dict[str, object]:
    ctx = mp.get_context("spawn")
    job, key = f"xsize-{uuid.uuid4().hex[:8]}", secrets.token_bytes(32)
    address = ({"embedded_address": broker.address} if broker is not None
               else {"redis_url": _common.REDIS, "amqp_url": _common.AMQP})
    barrier, results = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, workers, pattern, params, steps, job, key, address, barrier, results, density))
             for r in range(workers)]
    for p in procs:
        p.start()
    reports: list[dict] = []
    while len(reports) < workers:
        try:
            reports.append(results.get(timeout=1))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise SystemExit(f"{pattern} P={workers} {label(params)} on {transport}: a worker failed (above)")
    for p in procs:
        p.join()
    cleanup = connect(job, role="supervisor", key=key, **address)
    cleanup.delete_job()
    cleanup.close()
    phase = {p: statistics.median(statistics.median(r["times"][p]) for r in reports) for p in PHASES}
    return {"pattern": pattern, "workers": workers, "params": params, "transport": transport, "steps": steps,
            "density": density,
            **phase, "step": sum(phase.values()),
            "exchange": phase["publish"] + phase["gather"] + phase["apply"],
            "written": statistics.mean(r["written"] for r in reports),
            "read": statistics.mean(r["read"] for r in reports),
            "read_max": max(r["read"] for r in reports),
            "error": max(r["error"] for r in reports),
            "conserved": all(r["conserved"] for r in reports)}


def label(params: int) -> str:
    size = params * 4
    return f"{size >> 20} MB" if size >= 1 << 20 else f"{size >> 10} KB"


def report(rows: list[dict[str, object]], args: argparse.Namespace, info: dict[str, str]) -> str:
    lines = [f"Run: `{_common.command_line()}`; {_common.machine_line(info)}; load average at the end "
             f"{_common.loadavg()}.", "",
             "Median seconds per worker-step (publish, wait for peers, gather, apply); `exchange` is publish + gather "
             "+ apply; MB written and read per worker-step (mean over workers; the busiest reader in brackets); "
             "`ok` is the conservation check.", ""]
    for transport in args.transports:
        lines += [f"#### {transport}", ""]
        body = [[label(r["params"]), r["workers"], r["pattern"], r["publish"], r["wait"], r["gather"], r["apply"],
                 r["exchange"], r["written"] / 1e6, f"{r['read'] / 1e6:.3f} ({r['read_max'] / 1e6:.3f})",
                 "yes" if r["conserved"] else f"NO ({r['error']:.2g})"]
                for r in rows if r["transport"] == transport]
        lines += [_common.table(["model", "P", "exchange", "publish s", "wait s", "gather s", "apply s", "exchange s",
                                 "MB written", "MB read", "ok"], body), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(DEFAULT_SIZES), help="model sizes in float32 bytes (KB, MB)")
    parser.add_argument("--workers", default="2,3,4", help="worker counts P")
    parser.add_argument("--exchanges", default="all-to-all,allreduce,scatter-reduce")
    parser.add_argument("--transports", default="services",
                        help="services: Redis + RabbitMQ on localhost; embedded: the embedded broker")
    parser.add_argument("--steps", type=int, help="steps per run (default: by size, 4 to 40)")
    parser.add_argument("--write-results", action="store_true", help="replace this script's section of RESULTS.md")
    args = parser.parse_args()
    args.transports = args.transports.split(",")
    unknown = set(args.exchanges.split(",")) - set(EXCHANGES)
    if unknown:
        raise SystemExit(f"--exchanges: unknown {', '.join(sorted(unknown))} (known: {', '.join(EXCHANGES)})")
    info = _common.machine_info()
    rows = []
    broker = EmbeddedBroker() if "embedded" in args.transports else None
    try:
        for transport in args.transports:
            for params in map(parse_size, args.sizes.split(",")):
                for workers in map(int, args.workers.split(",")):
                    for pattern in args.exchanges.split(","):
                        row = run(pattern, workers, params, transport, broker if transport == "embedded" else None,
                                  args.steps or steps_for(params))
                        rows.append(row)
                        print(f"{transport} {label(params)} P={workers} {pattern}: exchange {row['exchange']:.4f} s, "
                              f"wait {row['wait']:.4f} s, read {row['read'] / 1e6:.3f} MB, "
                              f"conserved {row['conserved']}", flush=True)
    finally:
        if broker is not None:
            broker.stop()
    text = report(rows, args, info)
    print(text)
    if args.write_results:
        _common.update_results("exchange_size", text)


if __name__ == "__main__":
    main()
