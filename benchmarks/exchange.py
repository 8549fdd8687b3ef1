"""Bytes and time of the exchange: the patterns as an update grows, in-store merging, Redis sharding, the wire.

Parts (`--parts`, default all):

* patterns: all-to-all, AllReduce, ScatterReduce and in-store (a Lua script in Redis merges a step's updates) as a
  dense model's update grows from 1 KB to 90 MB of float32 (LambdaML's comparison; SPIRT's in-store averaging), and
  for a sparse update (1 % of a 4 MB model, as a hashed LR's step). The patterns' own code (`sync/exchanges/base.py`,
  `reduce.py`, `instore.py`) and the real transports: P worker processes, each with its own connection and float32
  replica; each step: `publish` the update, wait for every peer's (a `multiprocessing.Barrier` stands in for the
  supervisor's close), `gather` the close's updates, add them with the models' kernel (`optim.scatter_add`).
  Computing the gradient is left out: it is the same for every pattern. Per worker-step: median seconds of
  publish, wait, gather and apply, MB written and read, and conservation (every replica must equal the sum of all
  workers' updates, up to float32 rounding). Then in-store's script alone: three contributions of n entries merged
  by one EVALSHA and the kept record read again, what Redis spends per step and blocks its other clients for.
* sharding: PMF on the MovieLens sample under BSP with 1 and 2 Redis shards, each behind a link of its own
  (`netlink.py`, a tbf rate per `--rates`; RabbitMQ behind the first); time per step after `WARMUP` steps and the
  bytes each Redis received and sent (INFO). MLES measured two Redis 1.4x faster than one at 64 workers: does
  sharding help when the store's link is the bottleneck? Needs root (skipped with one line elsewhere).
* wire: an update frame's bytes, encode, seal (each process's Ed25519 identity, `mlless.protocol.sealing`), store
  and fetch (a Redis SET and GET on loopback), unseal and decode, on updates of the models' own steps shaped as the
  data sets (PMF on the 10M skewed ratings' shape at rank 10-50; LR on the clicks' 2^18 features); and a worker's
  sealing ms per step under all-to-all at P = 2, 4, 8 (its update sealed, P - 1 peers' unsealed, a report sealed
  and a close unsealed).
* overhead: per-step protocol overhead of PMF jobs (MovieLens sample, ISP, evaluation off) on the embedded
  transport and Redis + RabbitMQ: step time minus compute, and minus the filter too (messaging, I/O and waiting;
  the worker-step issue's targets ≤ 1 ms embedded, ≤ 2 ms over the services), with every phase's median.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import re
import statistics
import subprocess
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from . import _common, _runs, netlink

PHASES = ("publish", "wait", "gather", "apply")
UNITS = {"KB": 1 << 10, "MB": 1 << 20}
PATTERNS = ("all-to-all", "allreduce", "scatter-reduce", "in-store")
#: Steps left out of a sharded job's time per step: the first pay for connections and warm caches.
WARMUP = 5
STEP_PHASES = ("fetch", "compute", "filter", "write", "wait", "read", "apply")
#: The worker-step issue's targets for the median protocol-only overhead.
OVERHEAD_TARGET = {"embedded": 0.001, "services": 0.002}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parts", default="patterns,sharding,wire,overhead", help="comma list (default %(default)s)")
    p.add_argument("--sizes", help="dense updates in float32 bytes (default 1KB,16KB,256KB,4MB,16MB,90MB; "
                                   "--quick: 4MB)")
    p.add_argument("--workers", help="P of the patterns (default 2,3,4; --quick: 3) and of the sharded and "
                                     "overhead jobs (default 2,3,4 and 4,2; --quick: 2)")
    p.add_argument("--exchanges", default=",".join(PATTERNS), help="comma list (default %(default)s)")
    p.add_argument("--rates", help="tbf rates of each shard's link (default 20mbit,1gbit; --quick: 20mbit)")
    p.add_argument("--steps", type=int, help="steps of each sharded and overhead job (default 40 and 400; --quick: "
                                             "20 and 150)")


def run(args: argparse.Namespace) -> str:
    _common.single_thread_env()
    parts, out = args.parts.split(","), []
    if "patterns" in parts:
        out.append(patterns(args))
    if "sharding" in parts:
        out.append(sharding(args))
    if "wire" in parts:
        out.append(wire())
    if "overhead" in parts:
        out.append(overhead(args))
    return "\n".join(out)


def _ints(text: str | None, quick: bool, default: str, small: str) -> list[int]:
    return [int(x) for x in (text or (small if quick else default)).split(",")]


# ---- the patterns ---------------------------------------------------------------------------------------------------

def parse_size(text: str) -> int:
    """'90MB' as a parameter count: bytes of float32 values."""
    match = re.fullmatch(r"(\d+)(KB|MB)", text.strip())
    if not match:
        raise SystemExit(f"--sizes: {text!r} is not a size such as 16KB or 90MB")
    return int(match[1]) * UNITS[match[2]] // 4


def update_of(rank: int, params: int, density: float) -> tuple[np.ndarray, np.ndarray]:
    """The update worker `rank` publishes every step: every parameter, or a random `density` of them (sorted)."""
    rng = np.random.default_rng(rank)
    values = rng.standard_normal(params).astype(np.float32) * 1e-3
    if density >= 1:
        return np.arange(params, dtype=np.int32), values
    indices = np.sort(rng.choice(params, max(int(params * density), 1), replace=False)).astype(np.int32)
    return indices, values[:len(indices)]


def worker(rank: int, workers: int, pattern: str, params: int, steps: int, job: str, identity: str,
           barrier: Any, results: Any, density: float) -> None:
    import mlless.sync  # noqa: F401 - registers every pattern
    from mlless.protocol.identity import parse_identity
    from mlless.protocol.messages import Close
    from mlless.sync.exchanges.base import EXCHANGES
    from mlless.training.kernels import optim
    from mlless.transport import connect

    transport = connect(job, role="worker", rank=rank, identity=parse_identity(identity), redis_url=_common.REDIS,
                        amqp_url=_common.AMQP)
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
        sent = exchange.publish(step, indices, values)
        t1 = time.perf_counter()
        barrier.wait()
        t2 = time.perf_counter()
        updates = exchange.gather(Close(sender=-1, step=step, cursor=0, flags=0, live=ranks, updates=ranks, merges=()))
        t3 = time.perf_counter()
        for update in updates:
            if optim.scatter_add(replica, update.indices, update.values, marks) >= 0:
                rejected.append(f"bad index in the update of {update.sender}")
        t4 = time.perf_counter()
        merged, got = exchange.traffic()
        if step:
            for phase, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                times[phase].append(seconds)
            written, read = written + sent + merged, read + got
        barrier.wait()  # no worker overwrites a slot of step s + 2 while a peer still reads step s
    expected = np.zeros(params)
    for r in ranks:
        idx, val = update_of(r, params, density)
        expected[idx] += (steps + 1) * val.astype(np.float64)
    # float32 rounding: each of the (steps + 1) * P additions to the replica, and of the merged sums, is within an
    # ulp of the running value, so the replica is within that many ulps of the largest value
    bound = 4 * (steps + 1) * workers * np.finfo(np.float32).eps * float(np.max(np.abs(expected)))
    error = float(np.max(np.abs(replica - expected)))
    results.put({"times": times, "written": written / steps, "read": read / steps, "error": error,
                 "conserved": error <= bound and not rejected})
    transport.close()


def exchange_run(pattern: str, workers: int, params: int, steps: int, density: float = 1.0) -> dict[str, Any]:
    """One pattern at P = `workers` over Redis + RabbitMQ: the per worker-step medians and traffic of `worker`."""
    from mlless.protocol.identity import SUPERVISOR, Issuer
    from mlless.transport import connect

    ctx = mp.get_context("spawn")
    job, issuer = f"xsize-{uuid.uuid4().hex[:8]}", Issuer()
    barrier, results = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, workers, pattern, params, steps, job, issuer.issue(r).text(), barrier,
                                              results, density)) for r in range(workers)]
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
                raise SystemExit(f"{pattern} P={workers}, {params} parameters: a worker failed (above)")
    for p in procs:
        p.join()
    cleanup = connect(job, role="supervisor", identity=issuer.issue(SUPERVISOR), redis_url=_common.REDIS,
                      amqp_url=_common.AMQP)
    cleanup.delete_job()
    cleanup.close()
    phase = {p: statistics.median(statistics.median(r["times"][p]) for r in reports) for p in PHASES}
    return {**phase, "exchange": phase["publish"] + phase["gather"] + phase["apply"],
            "written": statistics.mean(r["written"] for r in reports),
            "read": statistics.mean(r["read"] for r in reports), "read_max": max(r["read"] for r in reports),
            "error": max(r["error"] for r in reports), "conserved": all(r["conserved"] for r in reports)}


def label(params: int) -> str:
    size = params * 4
    return f"{size >> 20} MB" if size >= 1 << 20 else f"{size >> 10} KB"


def script_cost(entries: int, dense: bool) -> tuple[float, float]:
    """Seconds of the first (merging) and second (kept record) in-store script run of a step of three workers'
    updates of `entries` entries each. Kept small: Redis serves nothing else while it merges, and it may be shared."""
    from mlless.protocol.identity import Issuer
    from mlless.sync.exchanges.instore import InStore
    from mlless.transport import connect

    job, issuer = f"instore-bench-{uuid.uuid4().hex[:8]}", Issuer()
    size = 4 * entries if dense else 100 * entries
    transports = [connect(job, role="worker", rank=r, identity=issuer.issue(r), redis_url=_common.REDIS,
                          amqp_url=_common.AMQP) for r in range(3)]
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
            if w.merged(1, [0, 1, 2])[0] is None:
                raise RuntimeError("the in-store merge of a complete step came back empty")
            times.append(time.perf_counter() - t0)
        return times[0], times[1]
    finally:
        transports[0].delete_job()
        for t in transports:
            t.close()


def patterns(args: argparse.Namespace) -> str:
    sizes = (args.sizes or ("4MB" if args.quick else "1KB,16KB,256KB,4MB,16MB,90MB")).split(",")
    cases = [(label(parse_size(s)) + " dense", parse_size(s), 1.0) for s in sizes] + [("1 % of 4 MB", 1 << 20, 0.01)]
    rows = []
    for name, params, density in cases:
        steps = int(np.clip(2e7 // max(int(params * density), 1), 3, 20))  # fewer for the big ones
        for workers in _ints(args.workers, args.quick, "2,3,4", "3"):
            for pattern in args.exchanges.split(","):
                r = exchange_run(pattern, workers, params, steps, density)
                rows.append([name, workers, pattern, r["publish"], r["wait"], r["gather"], r["apply"], r["exchange"],
                             r["written"] / 1e6, f"{r['read'] / 1e6:.3f} ({r['read_max'] / 1e6:.3f})",
                             "yes" if r["conserved"] else f"NO ({r['error']:.2g})"])
                print(f"  {name} P={workers} {pattern}: exchange {r['exchange']:.4f} s, read {r['read'] / 1e6:.3f} MB, "
                      f"conserved {r['conserved']}", flush=True)
    costs = [[entries, "one run" if dense else "spread", *script_cost(entries, dense)]
             for entries in (10_000, 30_000) for dense in (True, False)]
    return "\n".join([
        "#### The patterns, Redis + RabbitMQ on loopback", "",
        "Median seconds per worker-step (publish, wait for peers, gather, apply; `exchange` = publish + gather + "
        "apply), MB written and read per worker-step (mean over workers; the busiest reader in brackets); `ok` is the "
        "conservation check.", "",
        _common.table(["update", "P", "exchange", "publish s", "wait s", "gather s", "apply s", "exchange s",
                       "MB written", "MB read", "ok"], rows), "",
        "In-store's script alone: one step of 3 contributions of n entries each, merged by the first EVALSHA and read "
        "back by the second.", "",
        _common.table(["n", "indices", "merge s", "µs per entry added", "kept record s"],
                      [[n, how, first, 1e6 * first / (3 * n), again] for n, how, first, again in costs]), ""])


# ---- sharding ---------------------------------------------------------------------------------------------------------

def net_bytes(url: str) -> tuple[int, int]:
    """(received, sent) bytes of the Redis at `url` since it started."""
    import redis

    stats = redis.Redis.from_url(url).info("stats")
    return int(stats["total_net_input_bytes"]), int(stats["total_net_output_bytes"])


def sharded_job(data: Path, base: Path, workers: int, steps: int, redis_urls: list[str], amqp_url: str) -> list:
    name = f"shards{len(redis_urls)}-p{workers}"
    job = _runs.write_pmf_job(base / f"{name}.yaml", name=name, workers=workers, data=data, protocol="bsp",
                              stop={"maxSteps": steps})
    out = base / f"run-{name}-{int(time.time() * 1000) % 10**8}"
    load, before = _common.loadavg(), [net_bytes(u) for u in redis_urls]
    cmd = _runs.train_command(job, out, False, extra=["--amqp-url", amqp_url,
                                                      *(arg for url in redis_urls for arg in ("--redis-url", url))])
    subprocess.run(cmd, check=True)
    moved = [(a[0] - b[0], a[1] - b[1]) for b, a in zip(before, [net_bytes(u) for u in redis_urls])]
    times = [r["time"] for r in _runs.rows(out)]
    per_step = statistics.median(b - a for a, b in zip(times[WARMUP:], times[WARMUP + 1:]))
    print(f"  shards={len(redis_urls)} P={workers}: {per_step * 1e3:7.1f} ms/step  load {load}", flush=True)
    return [workers, len(redis_urls), per_step, moved, len(times), load]


def sharding(args: argparse.Namespace) -> str:
    data = _common.prepared(args.data_dir, "movielens")
    base = args.data_dir / "sharding"
    steps = args.steps or (20 if args.quick else 40)
    tables = [f"PMF, MovieLens sample, BSP, all-to-all, {steps} steps; each shard behind its own link, RabbitMQ behind "
              f"the first; ms per step is the median step after the first {WARMUP}; bytes are each Redis's INFO net "
              "input/output over the whole run.", ""]
    for rate in (args.rates or ("20mbit" if args.quick else "20mbit,1gbit")).split(","):
        with ExitStack() as stack:
            try:
                links = [stack.enter_context(netlink.limited_link(rate, rabbitmq=shard == 0)) for shard in range(2)]
            except netlink.LinkUnavailable as exc:
                return f"#### Redis sharding\n\nNot run: {exc}\n"
            runs = [sharded_job(data, base, workers, steps, [link.redis_url for link in links[:shards]],
                                links[0].amqp_url)
                    for workers in _ints(args.workers, args.quick, "2,3,4", "2") for shards in (1, 2)]
        one = {r[0]: r[2] for r in runs if r[1] == 1}
        rows = [[w, shards, f"{t * 1e3:.1f}", f"{one[w] / t:.2f}x", " / ".join(f"{i / 1e6:.1f} in, {o / 1e6:.1f} out"
                                                                              for i, o in moved),
                 " / ".join(f"{(i + o) / n / 1e3:.0f}" for i, o in moved), load]
                for w, shards, t, moved, n, load in runs]
        tables += [f"#### Redis sharding, tbf {netlink.rate_label(netlink.rate_bits(rate))} each way, per shard", "",
                   _common.table(["P", "shards", "ms per step (median)", "speed-up over 1 shard", "MB per shard (run)",
                                  "kB per shard per step", "load before"], rows), ""]
    return "\n".join(tables)


# ---- the wire ------------------------------------------------------------------------------------------------------------

def model_updates() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Updates of the models' own AdaGrad steps on synthetic batches shaped as the suites' data sets."""
    from mlless.data.batches import RatingsBatch, SparseBatch
    from mlless.data.synthetic import LrParams, PmfParams, generate_lr, generate_pmf
    from mlless.spec.config import ModelConfig
    from mlless.training.models.linear import LogisticRegression
    from mlless.training.models.pmf import PMF
    from mlless.training.optim import ADAGRAD_INITIAL

    out = {}
    for rank, n in ((10, 200), (20, 200), (50, 200), (20, 6250)):
        params = PmfParams(rows=n, users=70_000, items=10_000)
        chunk = next(generate_pmf(params, 1))
        model = PMF(params.users, params.items, params.mean, ModelConfig.of("pmf", rank=rank), 1)
        b = RatingsBatch(chunk.users.astype(np.int32), chunk.items.astype(np.int32), chunk.ratings)
        acc = np.full(model.accumulator_size, ADAGRAD_INITIAL, np.float32)
        out[f"PMF rank {rank}, {n:,} ratings"] = model.adagrad_step(b, acc, 0.1, 0.0)[:2]
    for n in (1000, 6250):
        params = LrParams(rows=n)
        chunk = next(generate_lr(params, 2))
        model = LogisticRegression(1 << params.hash_bits)
        b = SparseBatch(chunk.indptr, chunk.indices.astype(np.int32), chunk.values, chunk.labels)
        acc = np.full(model.accumulator_size, ADAGRAD_INITIAL, np.float32)
        out[f"LR, {n:,} rows"] = model.adagrad_step(b, acc, 0.1, 0.0)[:2]
    return out


def wire() -> str:
    import redis
    from mlless.protocol.framing import decode, encode
    from mlless.protocol.identity import Issuer, Verifier
    from mlless.protocol.messages import Update
    from mlless.protocol.sealing import SEAL_BYTES, seal, unseal

    issuer = Issuer()
    writer, reader, context = issuer.issue(0), Verifier(issuer.public), "value update:3:7"
    store, name = redis.Redis.from_url(_common.REDIS), f"mlless-wire-cost:{os.getpid()}"
    rows, per_step = [], []
    control = encode(Update(0, 7, np.arange(10, dtype=np.int32), np.ones(10, np.float32)), sealed=True)
    sealed_control = seal(control, writer, context)  # a report or close is about as small
    control_us = (_common.best_us(lambda: seal(control, writer, context))
                  + _common.best_us(lambda: unseal(sealed_control, reader, context)))
    for case, (idx, val) in model_updates().items():
        frame = encode(Update(0, 7, idx, val), sealed=True)
        sealed = seal(frame, writer, context)
        opened = unseal(sealed, reader, context)
        if decode(opened) != Update(0, 7, idx, val):
            raise RuntimeError(f"{case}: the update did not survive the wire")
        us = {"encode": _common.best_us(lambda: encode(Update(0, 7, idx, val), sealed=True)),
              "seal": _common.best_us(lambda: seal(frame, writer, context)),
              "store + fetch": _common.best_us(lambda: (store.set(name, sealed), store.get(name))),
              "unseal": _common.best_us(lambda: unseal(sealed, reader, context)),
              "decode": _common.best_us(lambda: decode(opened))}
        rows.append([case, idx.size, len(frame), *(f"{x:.1f}" for x in [*us.values(), sum(us.values())])])
        per_step.append([case, *(f"{(us['seal'] + (p - 1) * us['unseal'] + control_us) / 1e3:.2f}" for p in (2, 4, 8))])
    store.delete(name)
    return "\n".join([
        f"#### An update on the wire (fastest of 7 samples; seal: {SEAL_BYTES} bytes a frame)", "",
        _common.table(["update", "entries", "frame bytes", "encode µs", "seal µs", "store + fetch µs", "unseal µs",
                       "decode µs", "total µs"], rows), "",
        "A worker's sealing ms per step under all-to-all: its update sealed, P − 1 peers' unsealed, a report sealed "
        "and a close unsealed:", "",
        _common.table(["update", "P = 2", "P = 4", "P = 8"], per_step), ""])


# ---- per-step overhead -------------------------------------------------------------------------------------------------

def overhead_of(run_dir: Path, warmup: int) -> dict[str, Any]:
    """Step time (gaps between step closes), step − compute, and step − compute − filter: median and p90 after
    `warmup` steps; every phase's median."""
    body = [r for r in _runs.rows(run_dir) if r["phases"].get("wait") is not None]  # the last lacks barrier timings
    dt = np.diff([r["time"] for r in body])[warmup:]
    body = body[1:][warmup:]
    over = dt - np.array([r["phases"]["compute"] for r in body])
    proto = over - np.array([r["phases"]["filter"] for r in body])
    return {"steps": len(dt), **{f"{k}_med": float(np.median(v)) for k, v in (("step", dt), ("over", over),
                                                                               ("proto", proto))},
            **{f"{k}_p90": float(np.percentile(v, 90)) for k, v in (("step", dt), ("over", over), ("proto", proto))},
            "phases": {p: float(np.median([r["phases"][p] for r in body])) for p in STEP_PHASES}}


def overhead(args: argparse.Namespace) -> str:
    data = _common.prepared(args.data_dir, "movielens")
    base = args.data_dir / "protocol-overhead"
    steps, warmup = args.steps or (150 if args.quick else 400), 20
    rows, phases = [], []
    for P in _ints(args.workers, args.quick, "4,2", "2"):
        for transport in ("embedded", "services"):
            job = _runs.write_pmf_job(base / f"overhead-p{P}.yaml", name="bench-overhead", workers=P, data=data,
                                      protocol="isp", stop={"maxSteps": steps})
            out = base / f"run-p{P}-{transport}-{int(time.time() * 1000) % 10**8}"
            a = overhead_of(_runs.mlless_train(job, out, services=transport == "services"), warmup)
            target = OVERHEAD_TARGET[transport]
            rows.append([P, transport, a["steps"], *(f"{a[k] * 1e3:.2f}" for k in ("step_med", "step_p90", "over_med",
                                                                                   "over_p90", "proto_med", "proto_p90")),
                         f"≤ {target * 1e3:g} ms", "met" if a["proto_med"] <= target else "MISSED", _common.loadavg()])
            phases.append([P, transport, *(f"{a['phases'][p] * 1e3:.2f}" for p in STEP_PHASES)])
            print("  ", rows[-1], flush=True)
    return "\n".join([
        f"#### Per-step overhead: PMF, MovieLens sample, ISP, {steps} steps, the first {warmup} skipped, evaluation "
        "off", "",
        _common.table(["P", "transport", "steps", "step median ms", "p90", "step − compute median ms", "p90",
                       "− filter too, median ms", "p90", "target", "met?", "load after"], rows), "",
        "Median phase times (mean over workers, then median over steps):", "",
        _common.table(["P", "transport", *(f"{p} ms" for p in STEP_PHASES)], phases), ""])
