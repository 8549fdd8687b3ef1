#!/usr/bin/env python
"""Redis sharding on a rate-limited link: time per step and bytes per shard, 1 against 2 shards, at P = 2-4.

MLES (journal extension of MLLess, §6.5) measured two Redis instances 1.4x faster than one at 64 workers. The
question here is its direction: does sharding help when the store's link is the bottleneck? Each shard sits behind
a link of its own (`benchmarks/netlink.py`: a network namespace per shard, a veth pair with `tbf` both ways at
each of `--rates`), as two Redis VMs each have their own NIC; RabbitMQ shares the first shard's namespace and link in both
settings. The workers and the supervisor run on the host.

Each run is `mlless train` of PMF on the MovieLens sample under BSP (all-to-all: a worker writes its update once
and reads its P − 1 peers'), `--steps` steps, with `--redis-url` given once per shard. Reported:
- time per step: the median of the step-to-step times in metrics.jsonl after the first `WARMUP` steps;
- bytes per shard: what each Redis received and sent over the whole run (its INFO `total_net_input_bytes` and
  `total_net_output_bytes`, read before and after), and per step.
Runs alternate between 1 and 2 shards at each P, so the machine's load drifts alike over both. A slow link (20 Mbit/s,
where the frames' bytes take most of a step) and a fast one (1 Gbit/s, where they do not) answer "when".

    python benchmarks/sharding.py                          # 20mbit and 1gbit, P = 2,3,4, 40 steps: under 10 min
    python benchmarks/sharding.py --rates 20mbit --workers 2,4 --no-results
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import netlink  # noqa: E402

#: Steps left out of the time per step: the first steps pay for connections and warm caches.
WARMUP = 5


def net_bytes(url: str) -> tuple[int, int]:
    """(received, sent) bytes of the Redis at `url` since it started."""
    stats = redis.Redis.from_url(url).info("stats")
    return int(stats["total_net_input_bytes"]), int(stats["total_net_output_bytes"])


def run(data: Path, base: Path, workers: int, steps: int, redis_urls: list[str], amqp_url: str) -> dict[str, Any]:
    name = f"shards{len(redis_urls)}-p{workers}"
    job = _common.write_pmf_job(base / f"{name}.yaml", name=name, workers=workers, data=data, protocol="bsp",
                                stop={"maxSteps": steps})
    out = base / f"run-{name}-{int(time.time() * 1000) % 10**8}"
    load = _common.loadavg()
    before = [net_bytes(u) for u in redis_urls]
    cmd = [sys.executable, "-m", "mlless", "train", str(job), "--out", str(out), "-q", "--amqp-url", amqp_url,
           *(arg for url in redis_urls for arg in ("--redis-url", url))]
    subprocess.run(cmd, check=True)
    after = [net_bytes(u) for u in redis_urls]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = [r["time"] for r in rows]
    per_step = statistics.median(b - a for a, b in zip(times[WARMUP:], times[WARMUP + 1:]))
    moved = [(a_in - b_in, a_out - b_out) for (b_in, b_out), (a_in, a_out) in zip(before, after)]
    result = {"shards": len(redis_urls), "workers": workers, "steps": len(rows), "seconds_per_step": per_step,
              "bytes_per_shard": moved, "load_before": load, "run_dir": str(out)}
    print(f"  shards={len(redis_urls)} P={workers}: {per_step * 1e3:7.1f} ms/step; per shard MB in/out "
          + ", ".join(f"{i / 1e6:.1f}/{o / 1e6:.1f}" for i, o in moved) + f"  load {load}", flush=True)
    return result


def table(results: list[dict[str, Any]]) -> str:
    one = {r["workers"]: r["seconds_per_step"] for r in results if r["shards"] == 1}
    rows = []
    for r in results:
        steps = r["steps"]
        rows.append([r["workers"], r["shards"], f"{r['seconds_per_step'] * 1e3:.1f}",
                     f"{one[r['workers']] / r['seconds_per_step']:.2f}x" if r["workers"] in one else "",
                     " / ".join(f"{i / 1e6:.1f} in, {o / 1e6:.1f} out" for i, o in r["bytes_per_shard"]),
                     " / ".join(f"{(i + o) / steps / 1e3:.0f}" for i, o in r["bytes_per_shard"]),
                     r["load_before"]])
    return _common.table(["P", "shards", "ms per step (median)", "speed-up over 1 shard", "MB per shard (run)",
                          "kB per shard per step", "load before"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="20mbit,1gbit", help="comma list of tbf rates of each shard's link "
                                                          "(default %(default)s)")
    p.add_argument("--workers", default="2,3,4", help="comma list of P (default %(default)s)")
    p.add_argument("--steps", type=int, default=40, help="steps per run (default %(default)s)")
    p.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR, help="prepared data and runs")
    p.add_argument("--no-results", action="store_true", help="print only; leave RESULTS.md alone")
    args = p.parse_args(argv)
    info = _common.machine_info()
    print(_common.machine_line(info), flush=True)
    data = _common.prepare(args.data_dir / "movielens-small", "--sample", "movielens-small")
    base = args.data_dir / "sharding"
    base.mkdir(parents=True, exist_ok=True)
    tables, results = [], []
    for rate in args.rates.split(","):
        with ExitStack() as stack:
            try:
                links = [stack.enter_context(netlink.limited_link(rate, rabbitmq=shard == 0)) for shard in range(2)]
            except netlink.LinkUnavailable as exc:
                print(exc)
                return 1
            print(f"links: {'; '.join(link.description for link in links)}", flush=True)
            at_rate = [run(data, base, workers, args.steps, [link.redis_url for link in links[:shards]],
                           links[0].amqp_url)
                       for workers in (int(w) for w in args.workers.split(",")) for shards in (1, 2)]
        tables.append(f"#### tbf {netlink.rate_label(netlink.rate_bits(rate))} each way, per shard\n\n{table(at_rate)}\n")
        results += [{**r, "rate": rate} for r in at_rate]
        print(tables[-1], flush=True)
    if not args.no_results:
        body = "\n".join([
            "### Redis sharding on a rate-limited link (`benchmarks/sharding.py`, issue #25 item 1)", "",
            f"Machine: {_common.machine_line(info)}. Command: `{_common.command_line()}`. Each shard behind its own "
            f"link (`benchmarks/netlink.py`), RabbitMQ behind the first. PMF, MovieLens sample, BSP, all-to-all, "
            f"{args.steps} steps; time per step is the median step after the first {WARMUP}; bytes are each Redis's "
            "INFO net input/output over the whole run (start-up and final replicas included).", "", *tables])
        _common.update_results("sharding", body)
    (base / "sharding.json").write_text(json.dumps({"machine": info, "command": _common.command_line(),
                                                    "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
