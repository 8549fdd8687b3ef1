#!/usr/bin/env python
"""`mlless plan`'s predicted time to stop against the measured one, at P = 1, 2 and 3 (issue #24: error ≤ 25 %).

Per data set (`time_to_quality.py`'s quick sets, prepared under --data-dir on first use), one default job (only
`model.type`: its default protocol and stop rule, patience with minDelta, embedded transport), then in one run:

1. the job trained at P = 1, 2 and 3 on each of `--seeds` (`mlless train`), seed by seed (P = 1, 2, 3 on the
   first seed, then on the next: a machine whose load drifts over the minutes of the run slows every P alike,
   not the last P trained): the seconds from its start to its stop (`summary.json`'s wall_seconds) and its cost.
   Where patience stops a job, the stop moves from seed to seed by an evaluation or two (a tenth to a fifth of
   the steps of these short jobs), so a job's time is taken as the median over the seeds, and their range is
   shown beside it;
2. `mlless plan --from` the P = 1 and P = 2 runs of the first `--plan-seeds` seeds (default: all; a user with
   several runs of a job gives them all): P = 1 and 2 are in sample (σ, κ, start-up and the samples to the stop
   come from them), P = 3 is out of sample;
3. `mlless plan` with its default pilot (the job itself at P = 1 and 2, cut at 10 s): a pilot that stops on its own
   rule within the cut gives that P's stop as measured; past the cut, the stop rule is replayed on the fitted curve.

Error = predicted / measured − 1, measured being the median over the seeds. Results go to benchmarks/RESULTS.md (section `planner`) with --write.
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
from typing import Any

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import time_to_quality as ttq  # noqa: E402

KINDS = {"movielens": "pmf", "pmf1m-skew": "pmf", "lr200k": "logistic-regression"}
TARGET = 0.25


def write_job(base: Path, key: str, data: Path, seed: int | None = None) -> Path:
    """The default job of set `key`; with `seed`, its `spec.seed` set (the plans read the job without one)."""
    doc = {"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": f"plan-{key}"},
           "spec": {"workers": 1, "model": {"type": KINDS[key]}, "dataset": {"uri": str(data), "cacheBatches": True}}}
    if seed is not None:
        doc["spec"]["seed"] = seed
    path = base / (f"plan-{key}.yaml" if seed is None else f"plan-{key}-seed{seed}.yaml")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def train(job: Path, out: Path, workers: int) -> dict[str, Any]:
    subprocess.run([sys.executable, "-m", "mlless", "train", str(job), "--out", str(out), "--workers", str(workers),
                    "-q"], check=True)
    summary = json.loads((out / "summary.json").read_text())
    print(f"    {out.name}: {summary['wall_seconds']:.2f} s ({summary['stop_reason']}, {summary['epochs']:.2f} epochs, "
          f"start-up {summary['startup_seconds']:.2f} s)  load {_common.loadavg()}", flush=True)
    return summary


def plan(job: Path, *extra: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "mlless", "plan", str(job), "--workers", "1-3", "--json", *extra]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def run_set(key: str, base: Path, data_dir: Path, seeds: list[int], plan_seeds: int) -> dict[str, Any]:
    data = ttq.prepared(data_dir, key)
    job = write_job(base, key, data)
    print(f"{ttq.ALL_SETS[key].title}", flush=True)
    runs = {(P, seed): base / f"run-{key}-p{P}-seed{seed}" for seed in seeds for P in (1, 2, 3)}
    summaries = {(P, seed): train(write_job(base, key, data, seed), out, P) for (P, seed), out in runs.items()}
    measured = {P: [summaries[P, seed] for seed in seeds] for P in (1, 2, 3)}
    fitted = [str(runs[P, seed]) for seed in seeds[:plan_seeds] for P in (1, 2)]
    started = time.perf_counter()
    from_runs = plan(job, *(arg for run in fitted for arg in ("--from", run)))
    pilot_started = time.perf_counter()
    pilot = plan(job, "--out", str(base / f"pilot-{key}"))
    pilot_seconds = time.perf_counter() - pilot_started
    print(f"    planned from runs in {pilot_started - started:.1f} s, with the pilot in {pilot_seconds:.1f} s", flush=True)
    return {"key": key, "title": ttq.ALL_SETS[key].title, "measured": measured, "from_runs": from_runs,
            "plan_seeds": min(plan_seeds, len(seeds)), "pilot": pilot, "pilot_seconds": pilot_seconds}


def median(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The median over the seeds' summaries of each figure the table shows."""
    return {k: statistics.median(r[k] for r in runs) for k in ("wall_seconds", "startup_seconds", "epochs", "cost_usd")}


def rows(result: dict[str, Any]) -> list[tuple]:
    out = []
    by_runs = {p["workers"]: p for p in result["from_runs"]["predictions"]}
    by_pilot = {p["workers"]: p for p in result["pilot"]["predictions"]}
    for P, runs in result["measured"].items():
        P, m = int(P), median(runs)
        a, b = by_runs[P], by_pilot[P]
        train = m["wall_seconds"] - m["startup_seconds"]
        walls = [r["wall_seconds"] for r in runs]
        out.append((result["key"], P, f"{m['wall_seconds']:.2f}", f"{min(walls):.2f}-{max(walls):.2f}",
                    f"{m['startup_seconds']:.2f}", f"{m['epochs']:.2f}",
                    f"{a['seconds']:.2f}", f"{a['epochs']:.2f}", f"{a['seconds'] / m['wall_seconds'] - 1:+.0%}",
                    f"{(a['seconds'] - a['startup']) / train - 1:+.0%}", "in" if P < 3 else "**out**",
                    f"{b['seconds']:.2f}", f"{b['epochs']:.2f}", f"{b['seconds'] / m['wall_seconds'] - 1:+.0%}",
                    f"{m['cost_usd']:.5f}", f"{a['cost_usd']:.5f}"))
    return out


def report(results: list[dict[str, Any]], machine: str, command: str, loads: tuple[str, str]) -> str:
    errors = [(r["key"], int(P), which, pred["seconds"] / median(r["measured"][P])["wall_seconds"] - 1)
              for r in results for which in ("from_runs", "pilot") for pred in r[which]["predictions"]
              for P in [pred["workers"]]]
    worst_runs = max(abs(e) for _, _, w, e in errors if w == "from_runs")
    worst_pilot = max(abs(e) for _, _, w, e in errors if w == "pilot")
    misses = [f"{k} P = {p} ({'from runs' if w == 'from_runs' else 'pilot'}: {e:+.0%})" for k, p, w, e in errors
              if abs(e) > TARGET]
    body = ["## The planner against measured runs (`benchmarks/planner.py`, issue #24)", "",
            f"`{command}`; {machine}. {_common.load_note(*loads)} A prediction and the runs it is checked against "
            "were measured minutes apart. Default jobs (only `model.type`; the stop rule is "
            "patience 5 with minDelta 0.001, at most 50 epochs), embedded transport, each P trained on "
            f"{len(next(iter(results[0]['measured'].values())))} seeds, seed by seed. Measured = the median over "
            "the seeds of `summary.json`'s wall seconds, from the job's start to its stop; error = predicted / "
            f"measured − 1. Planned from runs: `mlless plan --from` the P = 1 and 2 runs of "
            f"{results[0].get('plan_seeds', 1)} seed(s).", "",
            "Columns: measured s to stop (the median; the seeds' range) and its start-up; planned from the P = 1 and 2 runs: s, epochs, error, and the "
            "error of the time after the start-up alone (training and wind-down), in or out of sample; planned from "
            "the pilot: s, epochs, error; measured and predicted (from the runs) cost.", "",
            _common.table(["set", "P", "measured s", "seeds' range s", "start-up s", "epochs", "from runs: s", "epochs", "error",
                           "error after start-up", "sample", "pilot: s", "epochs", "error", "measured $",
                           "predicted $"],
                          [row for r in results for row in rows(r)]), "",
            f"Worst error: **{worst_runs:.0%}** planning from the P = 1 and 2 runs, **{worst_pilot:.0%}** from the "
            f"pilot (target ≤ {TARGET:.0%}): " + ("**met** for every row." if not misses else
                                                "**missed** for " + "; ".join(misses) + "."), ""]
    for r in results:
        fit = r["from_runs"]["fit"]
        body.append(f"- {r['title']}: from runs σ = {fit['sigma_seconds'] * 1e3:.2f} ms, κ = "
                    f"{fit['kappa_seconds_per_byte'] * 1e9:.2f} ns/byte, β = {fit['beta']:.2f}, start-up "
                    f"{fit['startup_seconds']['a']:.2f} + {fit['startup_seconds']['b_per_worker']:.2f}·P s; the pilot "
                    f"took {r['pilot_seconds']:.0f} s (β = {r['pilot']['fit']['beta']:.2f}). Notes: "
                    + ("; ".join(r["from_runs"]["notes"] + r["pilot"]["notes"]) or "none") + ".")
    return "\n".join(body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="movielens,pmf1m-skew,lr200k", help="quick sets of time_to_quality.py (default %(default)s)")
    p.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR)
    p.add_argument("--out", type=Path, default=Path("/tmp/mlless-bench/planner"), help="run directories")
    p.add_argument("--seeds", default="1,2,3", help="seeds each P is trained on (default %(default)s)")
    p.add_argument("--plan-seeds", type=int, default=None, metavar="N",
                   help="plan from the P = 1 and 2 runs of the first N seeds (default: all of them)")
    p.add_argument("--write", action="store_true", help="write the section `planner` of RESULTS.md")
    p.add_argument("--render", type=Path, metavar="JSON", help="only render an earlier run's planner.json")
    args = p.parse_args(argv)
    if args.render:
        saved = json.loads(args.render.read_text())
        for r in saved["results"]:
            r["measured"] = {int(k): v for k, v in r["measured"].items()}
        text = report(saved["results"], saved["machine"], saved["command"], tuple(saved["loads"]))
        print(text)
        if args.write:
            _common.update_results("planner", text)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    base = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    base.mkdir(parents=True)
    machine, load = _common.machine_line(), _common.loadavg()
    seeds = [int(s) for s in args.seeds.split(",")]
    plan_seeds = len(seeds) if args.plan_seeds is None else args.plan_seeds
    results = [run_set(key, base, args.data_dir, seeds, plan_seeds) for key in args.datasets.split(",")]
    loads, command = (load, _common.loadavg()), _common.command_line()
    (base / "planner.json").write_text(json.dumps({"results": results, "machine": machine, "command": command,
                                                   "loads": loads}, indent=2, default=str))
    text = report(results, machine, command, loads)
    print(text)
    if args.write:
        _common.update_results("planner", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
