#!/usr/bin/env python
"""Per-step protocol overhead (everything except compute) for P workers on loopback.

Runs PMF on the MovieLens sample (batch 1000) or, with --dataset, any prepared PMF
set (the 10M synthetic one: batch 6250), ISP v = 0.7, batches cached in worker
memory, no periodic evaluation so the supervisor never stalls a step, with `mlless
train`, over the embedded broker and over Redis + RabbitMQ, for P = 4 and P = 2, and
reads the run's metrics.jsonl:

  * step time  = difference of consecutive step-close timestamps (`time`);
  * compute    = `phases.compute` (mean per worker: gradient + optimizer + accumulate);
  * overhead   = step time − compute (the issue's definition; includes the ISP
    `filter` phase, which is local CPU work, and waiting for the slowest peer);
  * protocol   = step time − compute − filter (only messaging, I/O and waiting): the
    worker-step issue's "step overhead", with targets ≤ 1 ms embedded and ≤ 2 ms over
    Redis + RabbitMQ at P = 2 on the 10M set.

The first --warmup steps are skipped. Median and p90 over the remaining steps, plus
the median of every phase (fetch, compute, filter, write, wait, read, apply: mean
per-worker seconds). With P workers + supervisor + broker sharing the machine's cores,
CPU contention shows up as `wait` (a step closes only when the slowest worker reports).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

import numpy as np  # noqa: E402

PHASES = ("fetch", "compute", "filter", "write", "wait", "read", "apply")
#: The worker-step issue's targets for the median protocol-only overhead.
TARGET = {"embedded": 0.001, "redis+rabbitmq": 0.002}


def run(base: Path, data: Path, workers: int, steps: int, transport: str, protocol: str) -> Path:
    job = base / f"overhead-p{workers}-{transport}-{protocol}.yaml"
    _common.write_pmf_job(job, name="bench-overhead", workers=workers, data=data, protocol=protocol,
                          stop={"maxSteps": steps})
    out = base / f"run-p{workers}-{transport}-{protocol}-{int(time.time() * 1000) % 10**8}"
    return _common.mlless_train(job, out, services=transport == "redis+rabbitmq")


def analyse(run_dir: Path, warmup: int) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["phases"].get("wait") is not None]  # the last row lacks barrier timings
    t = np.array([r["time"] for r in rows])
    dt = np.diff(t)
    body = rows[1:]
    keep = slice(warmup, None)
    dt = dt[keep]
    body = body[keep]
    comp = np.array([r["phases"]["compute"] for r in body])
    filt = np.array([r["phases"]["filter"] for r in body])
    over = dt - comp
    proto = over - filt
    phases = {p: float(np.median([r["phases"][p] for r in body])) for p in PHASES}
    return {"steps": len(dt), "step_med": float(np.median(dt)), "step_p90": float(np.percentile(dt, 90)),
            "over_med": float(np.median(over)), "over_p90": float(np.percentile(over, 90)),
            "proto_med": float(np.median(proto)), "proto_p90": float(np.percentile(proto, 90)),
            "phases": phases, "summary": json.loads((run_dir / "summary.json").read_text())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR,
                   help="prepared data and runs (default %(default)s)")
    p.add_argument("--dataset", type=Path, help="a prepared PMF dataset (default: the MovieLens sample)")
    p.add_argument("--steps", type=int, default=400, help="steps per run (default 400)")
    p.add_argument("--warmup", type=int, default=20, help="steps skipped at the start (default 20)")
    p.add_argument("--workers", default="4,2", help="comma list of P (default 4,2)")
    p.add_argument("--transports", default="embedded,redis+rabbitmq", help="comma list (default both)")
    p.add_argument("--protocols", default="isp", help="comma list of sync protocols: isp, bsp (default isp)")
    p.add_argument("--quick", action="store_true", help="150 steps, P = 4 only")
    p.add_argument("--write-results", action="store_true", help="refresh this script's section of RESULTS.md")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.workers = 150, "4"
    info = _common.machine_info()
    print(_common.machine_line(info))
    data = args.dataset or _common.prepare(args.data_dir / "movielens-small", "--sample", "movielens-small")
    manifest = json.loads((data / "manifest.json").read_text())
    base = args.data_dir / "protocol-overhead"
    base.mkdir(parents=True, exist_ok=True)

    results = []
    protocols = args.protocols.split(",")
    for P in [int(w) for w in args.workers.split(",")]:
        for protocol in protocols:
            for transport in args.transports.split(","):
                out = run(base, data, P, args.steps, transport, protocol)
                a = analyse(out, args.warmup)
                a.update(P=P, transport=f"{transport} {protocol.upper()}", target=TARGET[transport],
                         load=_common.loadavg(), run=str(out))
                results.append(a)
                print(f"  P={P} {a['transport']:19s} step {a['step_med'] * 1e3:6.2f} ms (p90 {a['step_p90'] * 1e3:6.2f})  "
                      f"overhead {a['over_med'] * 1e3:6.2f} ms (p90 {a['over_p90'] * 1e3:6.2f})  protocol-only "
                      f"{a['proto_med'] * 1e3:6.2f} ms  load {a['load']}", flush=True)

    ms = lambda x: f"{x * 1e3:.2f}"  # noqa: E731
    t1 = _common.table(["P", "transport", "steps", "step median ms", "step p90 ms", "overhead (step − compute) median ms",
                        "p90 ms", "protocol only (− filter) median ms", "p90 ms", "target", "met?", "load avg after"],
                       [(a["P"], a["transport"], a["steps"], ms(a["step_med"]), ms(a["step_p90"]), ms(a["over_med"]),
                         ms(a["over_p90"]), ms(a["proto_med"]), ms(a["proto_p90"]), f"≤ {a['target'] * 1e3:g} ms",
                         "met" if a["proto_med"] <= a["target"] else "MISSED", a["load"]) for a in results])
    t2 = _common.table(["P", "transport"] + [f"{ph} ms" for ph in PHASES],
                       [(a["P"], a["transport"], *(ms(a["phases"][ph]) for ph in PHASES)) for a in results])
    print("\n" + t1 + "\n\nMedian per-worker phase times:\n\n" + t2)
    if args.write_results:
        body = ["## 5. Protocol overhead per step (`benchmarks/protocol_overhead.py`)", "",
                f"Run: {_common.machine_line(info)}.", "",
                "```", _common.command_line(), "```", "",
                f"PMF on `{data.name}` ({manifest['n_train']:,} training ratings, batch {manifest['batch_size']:,}), "
                f"{' and '.join(p.upper() for p in protocols)}, {args.steps} steps per run, first "
                f"{args.warmup} skipped, evaluation disabled. Step time from consecutive step-close timestamps.", "",
                t1, "", "Median per-worker phase times (mean over workers, then median over steps):", "", t2, ""]
        _common.update_results("protocol_overhead", "\n".join(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
