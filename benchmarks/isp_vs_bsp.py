#!/usr/bin/env python
"""ISP vs BSP: bytes per step and validation RMSE for PMF with P workers, same step budget.

Every configuration runs `mlless train JOB.yaml --redis-url ... --amqp-url ...` (real
Redis and RabbitMQ; `--embedded` for the embedded broker) with a TrainingJob written by
this script: PMF rank 20, default optimizer, `stop.maxSteps` S, `sync.protocol` bsp or
isp with `significanceThreshold` v. From each run's summary.json: bytes per step
(`bytes_sent / steps`, all workers together) and `validation_loss` (RMSE of the
averaged final replicas on the validation split).

Target (issue): ISP (v = 0.7) sends >= 3x fewer bytes per step than BSP at <= 0.01
worse RMSE.
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


def train(base: Path, data: Path, name: str, workers: int, protocol: str, v: float, steps: int,
          embedded: bool, every: int = 0) -> dict:
    job = base / f"{name}.yaml"
    _common.write_pmf_job(job, name="bench-" + name.replace("_", "-").replace(".", "-"), workers=workers, data=data,
                          protocol=protocol, v=v, stop={"maxSteps": steps}, evaluate_every=every)
    run = _common.mlless_train(job, base / f"run-{name}-{int(time.time() * 1000) % 10**8}", services=not embedded)
    s = json.loads((run / "summary.json").read_text())
    s["run_dir"] = str(run)
    return s


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR,
                   help="prepared datasets and runs (default %(default)s)")
    p.add_argument("--steps", type=int, default=600, help="step budget on the MovieLens sample (default 600)")
    p.add_argument("--large-rows", type=int, default=2_000_000,
                   help="synthetic PMF rows for the second dataset (default 2,000,000; 0 = skip)")
    p.add_argument("--large-steps", type=int, default=300, help="step budget on the synthetic data (default 300)")
    p.add_argument("--workers", default="4,3", help="comma list of P (default 4,3)")
    p.add_argument("--sweep", default="0.3,1.0", help="extra ISP v values at the first P on the sample (default 0.3,1.0)")
    p.add_argument("--embedded", action="store_true", help="embedded broker instead of Redis + RabbitMQ")
    p.add_argument("--quick", action="store_true", help="sample only, P = 4, 200 steps, no sweep")
    p.add_argument("--write-results", action="store_true", help="refresh this script's section of RESULTS.md")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.large_rows, args.workers, args.sweep = 200, 0, "4", ""
    info = _common.machine_info()
    print(_common.machine_line(info))
    workers = [int(w) for w in args.workers.split(",")]
    sweep = [float(v) for v in args.sweep.split(",") if v]

    sample = _common.prepare(args.data_dir / "movielens-small", "--sample", "movielens-small")
    sets = [("MovieLens sample (batch 1000)", sample, args.steps, True)]
    prep_cmds = ["mlless prepare --sample movielens-small"]
    if args.large_rows:
        large_args = ("--synthetic", "pmf", "--rows", str(args.large_rows), "--users", "20000", "--items", "5000",
                      "--batch-size", "6250")
        prep_cmds.append("mlless prepare " + " ".join(large_args))
        large = _common.prepare(args.data_dir / f"pmf-{args.large_rows}-20kx5k", *large_args)
        sets.append((f"synthetic {args.large_rows / 1e6:g}M, 20k x 5k (batch 6250)", large, args.large_steps, False))

    base = args.data_dir / "isp-vs-bsp"
    base.mkdir(parents=True, exist_ok=True)
    rows, verdicts = [], []
    for label, data, steps, do_sweep in sets:
        for P in workers:
            configs = [("bsp", 0.0), ("isp", 0.7)] + ([("isp", v) for v in sweep] if do_sweep and P == workers[0] else [])
            res = {}
            for protocol, v in configs:
                name = f"{data.name}-p{P}-{protocol}{v:g}"
                s = train(base, data, name, P, protocol, v, steps, args.embedded)
                bps = s["bytes_sent"] / s["steps"]
                res[(protocol, v)] = (bps, s["validation_loss"])
                rows.append((label, P, protocol.upper() + (f" v={v:g}" if protocol == "isp" else ""), s["steps"],
                             f"{s['epochs']:.1f}", bps, s["validation_loss"], s["train_loss"], s["wall_seconds"],
                             _common.loadavg()))
                print(f"  {label} P={P} {protocol} v={v:g}: {bps:,.0f} B/step, val RMSE {s['validation_loss']:.4f}, "
                      f"{s['steps']} steps, {s['wall_seconds']:.1f}s (load {_common.loadavg()})", flush=True)
            b_bps, b_rmse = res[("bsp", 0.0)]
            for (protocol, v), (bps, rmse) in res.items():
                if protocol == "isp":
                    red = b_bps / bps if bps else float("inf")
                    d = rmse - b_rmse
                    ok = red >= 3 and d <= 0.01
                    verdicts.append((label, P, f"v={v:g}", f"{red:.1f}x", f"{d:+.4f}",
                                     ("met" if ok else "MISSED") if v == 0.7 else ("(would meet)" if ok else "(would miss)")))

    t1 = _common.table(["data", "P", "protocol", "steps", "epochs", "bytes/step", "val RMSE", "train RMSE",
                        "wall s", "load avg after"], rows)
    t2 = _common.table(["data", "P", "ISP", "fewer bytes than BSP", "Δ RMSE vs BSP", "target (≥ 3x, ≤ +0.01)"], verdicts)
    print("\n" + t1 + "\n\n" + t2)
    if args.write_results:
        body = ["## 4. ISP vs BSP (`benchmarks/isp_vs_bsp.py`)", "",
                f"Run: {_common.machine_line(info)}. Transport: "
                f"{'embedded broker' if args.embedded else 'Redis 127.0.0.1:6379 + RabbitMQ 127.0.0.1:5672'}.", "",
                "```", _common.command_line(), *prep_cmds, "```", "",
                "Each row is one `mlless train` run (its TrainingJob YAML is written next to the run under "
                f"`{base}`); bytes/step = summary `bytes_sent / steps` (all workers); RMSE = the averaged final model "
                "on the validation split.", "", t1, "", t2, ""]
        _common.update_results("isp_vs_bsp", "\n".join(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
