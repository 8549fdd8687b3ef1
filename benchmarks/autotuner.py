#!/usr/bin/env python
"""Scale-in auto-tuner: BSP vs ISP vs ISP + tuner on PMF, same stop rule (issue #3 §6).

Every run is `mlless train JOB.yaml --redis-url ... --amqp-url ... --out RUNDIR` (real Redis and
RabbitMQ; `--embedded` for the embedded broker) with a TrainingJob written by this script: PMF
rank 20, default optimizer, P workers, and

- BSP:          `sync.protocol: bsp`
- ISP:          `sync.protocol: isp`, `significanceThreshold: v` (0.7)
- ISP + tuner:  as ISP, plus `autoscaler: {enabled: true, intervalSeconds: I, horizonSeconds: H,
                minWorkers: 1}` (the papers' 20 s / 10 s scaled to the job length)

Stop rule, identical for all three: `stop.targetLoss` T on the *training* RMSE (no validation in the
loop; `evaluation.everySteps: 0`), held for `targetSteps` consecutive steps, plus `maxSeconds` as a
safety. T comes from `--target-loss`, or from a pilot (`--pilot-seconds`): BSP and ISP train for that
long without a target, and T is the larger of the two rolling-mean training losses they had reached at
`--pilot-fraction` of the pilot, so that every variant reaches it with headroom.

Per run, from summary.json / metrics.jsonl: time to target (`wall_seconds` when `stop_reason` is
"target loss reached"), `cost_usd` (and its split into workers vs supervisor + Redis + RabbitMQ),
Perf/$ = `perf_per_dollar` = 1/(seconds x dollars), final validation RMSE of the averaged model,
and workers over time (`scaling_events`, metrics `workers`). Each variant runs `--repeats` times,
interleaved (BSP, ISP, tuner, BSP, ...); medians and min-max spread are reported.

Target (issue): the tuner raises Perf/$ by >= 1.3x over ISP with <= 5 % worse time to target and
equal final quality (papers: 1.4-1.6x).

With `--report DIR` the median run of each variant is rendered by `mlless report` into DIR.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

VARIANTS = ("BSP", "ISP", "ISP + tuner")


def write_job(path: Path, name: str, data: Path, workers: int, variant: str, v: float, target: float | None,
              target_steps: int, max_seconds: float, interval: float, horizon: float) -> None:
    stop: dict = {"maxSeconds": max_seconds}
    if target is not None:
        stop |= {"targetLoss": target, "targetSteps": target_steps}
    autoscaler = None
    if variant == "ISP + tuner":
        autoscaler = {"enabled": True, "intervalSeconds": interval, "horizonSeconds": horizon, "minWorkers": 1}
    _common.write_pmf_job(path, name=f"bench-tuner-{name}", workers=workers, data=data,
                          protocol="bsp" if variant == "BSP" else "isp", v=0.0 if variant == "BSP" else v,
                          stop=stop, autoscaler=autoscaler)


def train(job: Path, run: Path, embedded: bool) -> dict:
    _common.mlless_train(job, run, services=not embedded)
    s = json.loads((run / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    s["run_dir"] = str(run)
    s["_rows"] = rows
    return s


def rolling_mean(values: list[float], k: int = 10) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(values):
        acc += x
        if i >= k:
            acc -= values[i - k]
        out.append(acc / min(i + 1, k))
    return out


def loss_at(rows: list[dict], seconds: float, k: int = 10) -> float:
    """The rolling-mean training loss at the last step closed before `seconds`."""
    losses = [r["loss"] for r in rows if r.get("loss") is not None]
    times = [r["time"] for r in rows if r.get("loss") is not None]
    smooth = rolling_mean(losses, k)
    best = smooth[0]
    for t, x in zip(times, smooth):
        if t > seconds:
            break
        best = x
    return best


def workers_timeline(rows: list[dict]) -> str:
    """Run-length encoding of the worker count over time: '4@0s → 3@21.3s → 2@27.0s'."""
    parts, last = [], None
    for r in rows:
        if r["workers"] != last:
            parts.append(f"{r['workers']}@{r['time']:.1f}s")
            last = r["workers"]
    return " → ".join(parts) if parts else "–"


def worker_seconds(rows: list[dict]) -> float:
    """∫ workers dt over the recorded steps (the metric the tuner lowers)."""
    total, prev_t = 0.0, 0.0
    for r in rows:
        total += r["workers"] * (r["time"] - prev_t)
        prev_t = r["time"]
    return total


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float], digits: str = ".1f") -> str:
    if not xs:
        return "–"
    return f"{min(xs):{digits}}–{max(xs):{digits}}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR,
                   help="prepared datasets and runs (default %(default)s)")
    p.add_argument("--rows", type=int, default=10_000_000, help="synthetic PMF ratings (default 10M, ML-10M-sized)")
    p.add_argument("--users", type=int, default=70_000, help="synthetic users (default 70,000)")
    p.add_argument("--items", type=int, default=10_000, help="synthetic items (default 10,000)")
    p.add_argument("--batch-size", type=int, default=6250, help="mini-batch size (default 6250, the papers')")
    p.add_argument("--workers", type=int, default=4, help="P (default 4)")
    p.add_argument("--v", type=float, default=0.7, help="ISP significance threshold v (default 0.7)")
    p.add_argument("--target-loss", type=float, help="training-RMSE target; without it a pilot chooses one")
    p.add_argument("--target-steps", type=int, default=3,
                   help="consecutive steps at or below the target (default 3: the per-step training RMSE is noisy, ±0.005 at P = 4 and ~2x that at P = 1, so 10 in a row near a plateau is a lottery that penalises fewer workers)")
    p.add_argument("--pilot-seconds", type=float, default=90, help="pilot length per variant (default 90 s)")
    p.add_argument("--pilot-fraction", type=float, default=0.35,
                   help="target = loss reached at this fraction of the pilot, worst of BSP/ISP (default 0.35)")
    p.add_argument("--max-seconds", type=float, default=120, help="maxSeconds safety stop (default 120)")
    p.add_argument("--interval", type=float, default=1.0, help="autoscaler intervalSeconds (default 1; papers 20)")
    p.add_argument("--horizon", type=float, default=0.5, help="autoscaler horizonSeconds (default 0.5; papers 10)")
    p.add_argument("--repeats", type=int, default=3, help="runs per variant, interleaved (default 3)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma list of variants (default all three)")
    p.add_argument("--embedded", action="store_true", help="embedded broker instead of Redis + RabbitMQ")
    p.add_argument("--report", type=Path, help="render the median run of each variant with `mlless report` here")
    p.add_argument("--quick", action="store_true", help="MovieLens sample, 1 repeat, short pilot")
    p.add_argument("--section", default="autotuner",
                   help="RESULTS.md section to refresh (default autotuner; e.g. autotuner_long for a second target)")
    p.add_argument("--write-results", action="store_true", help="refresh this script's section of RESULTS.md")
    args = p.parse_args(argv)
    info = _common.machine_info()
    print(_common.machine_line(info), flush=True)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            p.error(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")

    if args.quick:
        data = _common.prepare(args.data_dir / "movielens-small", "--sample", "movielens-small")
        prep_cmd = "mlless prepare --sample movielens-small"
        label = "MovieLens sample (batch 1000)"
        args.repeats, args.pilot_seconds, args.max_seconds = 1, 20, 60
    else:
        prep_args = ("--synthetic", "pmf", "--rows", str(args.rows), "--users", str(args.users),
                     "--items", str(args.items), "--batch-size", str(args.batch_size))
        prep_cmd = "mlless prepare " + " ".join(prep_args)
        data = _common.prepare(args.data_dir / f"pmf-{args.rows}-{args.users // 1000}kx{args.items // 1000}k",
                               *prep_args)
        label = (f"synthetic PMF {args.rows / 1e6:g}M ratings, {args.users:,} users x {args.items:,} items "
                 f"(batch {args.batch_size})")
    manifest = json.loads((data / "manifest.json").read_text())
    base = args.data_dir / "autotuner"
    base.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%H%M%S")

    def run(variant: str, tag: str, target: float | None, max_seconds: float) -> dict:
        slug = {"BSP": "bsp", "ISP": "isp", "ISP + tuner": "tuner"}[variant]
        name = f"{slug}-{tag}"
        job = base / f"{name}.yaml"
        write_job(job, name, data, args.workers, variant, args.v, target, args.target_steps, max_seconds,
                  args.interval, args.horizon)
        s = train(job, base / f"run-{stamp}-{name}", args.embedded)
        s["_variant"] = variant
        print(f"  {variant:12s} {tag}: {s['stop_reason']}, {s['wall_seconds']:.1f}s, {s['steps']} steps, "
              f"train {s['train_loss']:.4f}, val {s['validation_loss']:.4f}, ${s['cost_usd']:.5f}, "
              f"Perf/$ {s['perf_per_dollar']:.4g}, workers {workers_timeline(s['_rows'])} "
              f"(load {_common.loadavg()})", flush=True)
        return s

    pilot_note = ""
    target = args.target_loss
    if target is None:
        at = args.pilot_seconds * args.pilot_fraction
        reached = {}
        for variant in ("BSP", "ISP"):
            s = run(variant, "pilot", None, args.pilot_seconds)
            reached[variant] = loss_at(s["_rows"], at)
        target = round(max(reached.values()), 4)
        pilot_note = (f"Target chosen by a pilot: BSP and ISP trained {args.pilot_seconds:g} s each without a target; "
                      f"their 10-step rolling-mean training RMSE at {at:g} s was "
                      + ", ".join(f"{k} {x:.4f}" for k, x in reached.items())
                      + f"; the target is the larger, {target:.4f}.")
        print(pilot_note, flush=True)

    results: dict[str, list[dict]] = {v: [] for v in variants}
    for rep in range(args.repeats):
        for variant in variants:
            results[variant].append(run(variant, f"r{rep + 1}", target, args.max_seconds))

    per_run, agg = [], {}
    for variant in variants:
        rs = results[variant]
        for i, s in enumerate(rs, 1):
            b = s["cost_breakdown_usd"]
            reached = s["stop_reason"] == "target loss reached"
            per_run.append((variant, i, s["stop_reason"], s["wall_seconds"] if reached else None, s["steps"],
                            f"{s['epochs']:.2f}", s["cost_usd"], b["workers"], b["supervisor"] + b["redis"] + b["rabbitmq"],
                            s["perf_per_dollar"], s["train_loss"], s["validation_loss"], worker_seconds(s["_rows"]),
                            workers_timeline(s["_rows"]), s["run_dir"].rsplit("/", 1)[-1]))
        ttt = [s["wall_seconds"] for s in rs if s["stop_reason"] == "target loss reached"]
        agg[variant] = {
            "reached": len(ttt), "n": len(rs), "ttt": ttt,
            "cost": [s["cost_usd"] for s in rs], "ppd": [s["perf_per_dollar"] for s in rs],
            "val": [s["validation_loss"] for s in rs], "train": [s["train_loss"] for s in rs],
            "wsec": [worker_seconds(s["_rows"]) for s in rs], "steps": [s["steps"] for s in rs],
        }
    t1 = _common.table(["variant", "run", "stop reason", "time to target s", "steps", "epochs", "cost $",
                        "workers $", "supervisor+services $", "Perf/$", "train RMSE", "val RMSE", "worker·s",
                        "workers over time (count@seconds)", "run dir"], per_run)
    rows2 = []
    for variant in variants:
        a = agg[variant]
        rows2.append((variant, f"{a['reached']}/{a['n']}", med(a["ttt"]), spread(a["ttt"]), f"{med(a['cost']):.5f}",
                      spread(a["cost"], ".5f"), f"{med(a['ppd']):.3g}", spread(a["ppd"], ".3g"), f"{med(a['val']):.4f}",
                      spread(a["val"], ".4f"), f"{med(a['wsec']):.0f}"))
    t2 = _common.table(["variant", "reached target", "time to target s (median)", "spread", "cost $ (median)",
                        "spread", "Perf/$ (median)", "spread", "val RMSE (median)", "spread", "worker·s (median)"], rows2)
    verdict = ""
    if "ISP" in agg and "ISP + tuner" in agg and agg["ISP"]["ttt"] and agg["ISP + tuner"]["ttt"]:
        i, t = agg["ISP"], agg["ISP + tuner"]
        ppd_ratio = med(t["ppd"]) / med(i["ppd"])
        ttt_ratio = med(t["ttt"]) / med(i["ttt"])
        d_val = med(t["val"]) - med(i["val"])
        ok = ppd_ratio >= 1.3 and ttt_ratio <= 1.05 and d_val <= 0.01
        verdict = (f"Tuner vs ISP (medians): Perf/$ **{ppd_ratio:.2f}x** (target ≥ 1.3x), time to target "
                   f"**{ttt_ratio:.2f}x** (target ≤ 1.05x), validation RMSE {med(t['val']):.4f} vs {med(i['val']):.4f} "
                   f"(Δ {d_val:+.4f}), cost {med(t['cost']) / med(i['cost']):.2f}x, worker·s "
                   f"{med(t['wsec']) / med(i['wsec']):.2f}x → **{'met' if ok else 'MISSED'}**.")
        print(verdict)
    print("\n" + t1 + "\n\n" + t2, flush=True)

    report_note = ""
    if args.report:
        chosen, labels = [], []
        for variant in variants:
            rs = sorted(results[variant], key=lambda s: s["wall_seconds"])
            s = rs[(len(rs) - 1) // 2]
            chosen.append(s["run_dir"])
            labels += ["--label", variant]
        cmd = [sys.executable, "-m", "mlless", "report", *chosen, "--out", str(args.report), *labels,
               "--title", f"BSP vs ISP vs ISP + auto-tuner, PMF, P = {args.workers}"]
        subprocess.run(cmd, check=True)
        report_note = (f"Report (`mlless report`, the median-time run of each variant: "
                       + ", ".join(f"`{c.rsplit('/', 1)[-1]}`" for c in chosen) + f") in `{args.report}`.")
        print(report_note)

    if args.write_results:
        body = [f"## 6{'' if args.section == 'autotuner' else ' (' + args.section + ')'}. Auto-tuner: BSP vs ISP vs "
                f"ISP + tuner, target training RMSE {target:.4f} (`benchmarks/autotuner.py`)", "",
                f"Run: {_common.machine_line(info)}. Transport: "
                f"{'embedded broker' if args.embedded else 'Redis 127.0.0.1:6379 + RabbitMQ 127.0.0.1:5672'}.", "",
                "```", _common.command_line(), prep_cmd, "```", "",
                f"Data: {label}; {manifest.get('n_train', manifest.get('train_rows', '?'))} training ratings. "
                f"P = {args.workers}, PMF rank 20, default Nesterov, ISP v = {args.v:g}. Stop: training RMSE ≤ "
                f"**{target:.4f}** for {args.target_steps} consecutive steps, `maxSeconds: {args.max_seconds:g}` "
                f"as safety; no validation during training. Tuner: `intervalSeconds: {args.interval:g}`, "
                f"`horizonSeconds: {args.horizon:g}`, `minWorkers: 1`, S = 0.15, default knee settings. "
                f"{args.repeats} runs per variant, interleaved. Job YAMLs and run dirs under `{base}`.", "",
                *( [pilot_note, ""] if pilot_note else [] ),
                "Per run (cost split: workers vs supervisor + Redis + RabbitMQ, all billed by the library's "
                "cost model; worker·s = ∫ workers dt from metrics.jsonl):", "", t1, "",
                "Medians and min–max spread:", "", t2, "", verdict, "", report_note, ""]
        _common.update_results(args.section, "\n".join(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
