"""`mlless plan JOB.yaml`: predicted time to stop, cost and Perf/$ by worker count, and the P to run.

The model (`planning.model`) is fitted on earlier run directories of the job (`--from`), or on short pilot runs
of it started here (`--pilot-workers`, `--pilot-seconds`), on the embedded transport or the given services.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from mlless.contract import EXIT_FAILED, EXIT_USAGE, STOP_INTERRUPTED, shard_urls
from mlless.planning.model import Fit, Link, Prediction, choose, fit, predict
from mlless.planning.measures import PlanError, RunMeasure, measure
from mlless.plugins import load_plugins
from mlless.progress import Progress
from mlless.spec import TrainingJob, load_manifest

#: The default pilot: these worker counts, each run as the job itself (its evaluations and stop rules, the
#: auto-tuner off) for at most PILOT_SECONDS: a job that ends sooner is measured whole, its stop the job's own. A
#: pilot cut at a few epochs can end while the validation loss still falls, and no fitted curve shows where it turns.
PILOT_WORKERS = "1,2"
PILOT_SECONDS = 10.0
#: The CLI's reader of --redis-url/--amqp-url (and $REDIS_URL/$AMQP_URL): (redis, amqp), both or neither.
ServiceUrls = Callable[[argparse.Namespace], tuple[str | None, str | None]]
#: Redis round trips and bytes the link measurement takes.
PINGS, PROBE_BYTES = 50, 4 << 20


def worker_counts(text: str) -> list[int]:
    """`1-4`, `1..4`, `1,2,4` or `3` as sorted worker counts; PlanError naming the flag's value."""
    counts: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:(?:-|\.\.)\s*(\d+)\s*)?", part)
        if m is None:
            raise PlanError(f"--workers {text!r}: give a range (1-4) or a list (1,2,4) of worker counts")
        lo, hi = int(m[1]), int(m[2] or m[1])
        if hi < lo:
            raise PlanError(f"--workers {text!r}: {lo}-{hi} is an empty range")
        counts.update(range(lo, hi + 1))
    if not counts or min(counts) < 1:
        raise PlanError(f"--workers {text!r}: worker counts are 1 or more")
    return sorted(counts)


def measure_link(redis_url: str | None) -> Link:
    """The hop and bandwidth to Redis (PING round trips; a SET and a GET of PROBE_BYTES); the embedded transport
    has neither: its cost per step and per byte lands in σ and κ."""
    if not redis_url:
        return Link(0.0, float("inf"), "embedded transport (in-process)")
    import redis

    redis_url = shard_urls(redis_url)[0]  # a sharded Redis: the link to its first shard
    client = redis.Redis.from_url(redis_url)
    rtts = []
    for _ in range(PINGS):
        t = time.perf_counter()
        client.ping()
        rtts.append(time.perf_counter() - t)
    key, blob = f"mlless-plan-probe-{os.getpid()}", b"\0" * PROBE_BYTES
    t = time.perf_counter()
    client.set(key, blob)
    client.get(key)
    elapsed = time.perf_counter() - t
    client.delete(key)
    return Link(statistics.median(rtts), 2 * PROBE_BYTES / elapsed, f"Redis at {redis_url.split('@')[-1]}")


def pilot(job_path: str, workers: list[int], seconds: float, epochs: float | None, out: Path,
          services: Any) -> list[Path]:
    """Run the job at each of `workers` with the auto-tuner off, cut at `seconds` (and `epochs`, if given) unless
    its own limits or loss rules end it sooner; what it would do past the cut is the model's to say."""
    from mlless.runtime.local import train_local

    dirs = []
    for P in workers:
        job = load_manifest(job_path, {"workers": P, "autoscaler": {"enabled": False}})
        # Cut the resolved rules, not the manifest's: a limit written into the manifest would drop the default
        # maxEpochs (`spec.job.from_manifest`), and the pilot would no longer stop where the job does.
        stop = dataclasses.replace(job.stop, max_seconds=min(seconds, job.stop.max_seconds or math.inf))
        if epochs is not None:
            stop = dataclasses.replace(stop, max_epochs=min(epochs, stop.max_epochs or math.inf))
        job = dataclasses.replace(job, stop=stop)
        run_dir = out / f"pilot-p{P}"
        cut = f"{seconds:g} s" + ("" if epochs is None else f" or {epochs:g} epochs")
        print(f"pilot: {job.name} at P = {P}, at most {cut} -> {run_dir}", file=sys.stderr, flush=True)
        if train_local(job, run_dir, services, Progress(enabled=False))["stop_reason"] == STOP_INTERRUPTED:
            raise KeyboardInterrupt  # a Ctrl-C ended the pilot: the plan stops with it, as `mlless train` does
        dirs.append(run_dir)
    return dirs


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(predictions: list[Prediction]) -> str:
    head = ("P", "time to stop s", "start-up s", "step ms", "bound", "steps", "epochs", "stops on", "cost $", "Perf/$",
            "fitted")
    rows = [(str(p.workers), f"{p.seconds:.1f}", f"{p.startup:.1f}", f"{p.step_seconds * 1e3:.2f}", p.bound,
             f"{p.steps:.0f}", f"{p.epochs:.2f}", p.stops_on, f"{p.cost_usd:.5f}", _fmt(p.perf_per_dollar, ".1f"),
             "run" if p.measured else "model") for p in predictions]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in [head, *rows])


def plan(job: TrainingJob, runs: list[RunMeasure], counts: list[int], link: Link, cores: int,
         deadline: float | None, budget: float | None) -> dict[str, Any]:
    """The fit, the predictions and the choice, as `--json` prints them (PlanError on bad input); the choice's
    workers are None when no P meets the deadline or the budget."""
    model: Fit = fit(job, runs, link, cores)
    predictions = [predict(model, job, P) for P in counts]
    choice = None
    if deadline is not None or budget is not None:
        pick, why = choose(predictions, deadline, budget)
        choice = {"workers": None if pick is None else pick.workers, "why": why}
    return {"job": job.name, "runs": [str(r.run_dir) for r in runs], "fit": model.as_dict(), "notes": model.notes,
            "predictions": [dataclasses.asdict(p) for p in predictions], "choice": choice}


def _positive(name: str, v: float | None) -> None:
    if v is not None and not v > 0:
        raise PlanError(f"{name} {v:g}: must be more than 0")


def run(args: argparse.Namespace, services: ServiceUrls) -> int:
    try:
        return _run(args, services)
    except PlanError as exc:
        print(f"mlless: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _run(args: argparse.Namespace, services: ServiceUrls) -> int:
    from mlless.runtime.local import Services

    counts = worker_counts(args.workers)
    _positive("--deadline", args.deadline)
    _positive("--budget", args.budget)
    _positive("--pilot-seconds", args.pilot_seconds)
    _positive("--pilot-epochs", args.pilot_epochs)
    load_plugins()
    job = load_manifest(args.job)
    redis_url, amqp_url = services(args)
    dirs = [Path(d) for d in args.from_runs or []]
    if not dirs:
        out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="mlless-plan-"))
        dirs = pilot(args.job, worker_counts(args.pilot_workers), args.pilot_seconds, args.pilot_epochs, out,
                     Services(redis_url, amqp_url))
        print(f"pilot runs in {out} (plan from them again with --from)", file=sys.stderr)
    runs = [measure(d) for d in dirs]
    result = plan(job, runs, counts, measure_link(redis_url), args.cores, args.deadline, args.budget)
    # No P that meets the deadline or the budget is an answer, not bad input: the table still shows how near each
    # comes, and the exit code tells a script there is no pick.
    status = EXIT_FAILED if result["choice"] and result["choice"]["workers"] is None else 0
    if args.json:
        print(json.dumps(result, indent=2, allow_nan=False))
        return status
    print(f"{job.name}: predicted by worker count, fitted on {len(runs)} run(s) "
          f"({', '.join(str(d) for d in dirs)}); {result['fit']['link']}, {args.cores} cores")
    print(table([Prediction(**p) for p in result["predictions"]]))
    for note in result["notes"]:
        print(f"note: {note}")
    if result["choice"]:
        print(result["choice"]["why"])
    return status


def add_parser(sub: argparse._SubParsersAction, service_args: Callable[[argparse.ArgumentParser], None],
               services: ServiceUrls) -> None:
    """`mlless plan`; `service_args` adds the CLI's --redis-url/--amqp-url and `services` reads them (the CLI's own,
    passed in: the CLI imports this module, not the other way round)."""
    p = sub.add_parser(
        "plan",
        help="predict time to stop, cost and Perf/$ by worker count, and pick P for a deadline or a budget",
        description="Fit LambdaML's analytic model of the job (start-up; per-step compute; bytes per step over the "
        "measured latency and bandwidth; samples until its stop rule fires, from the loss curve) on earlier runs "
        "of it (--from) or on short pilot runs started here, and print by worker count the predicted time to stop, "
        "cost at the job's spec.pricing and Perf/$ = 1/(seconds x dollars). With --deadline it picks the cheapest "
        "P that meets it; with --budget, the fastest P within it; when none does, it says which comes nearest and "
        "exits 1. See docs/user-guide.md#planning-mlless-plan.",
    )
    p.add_argument("job", metavar="JOB.yaml", help="TrainingJob manifest to plan")
    p.add_argument("--workers", required=True, metavar="RANGE",
                   help="worker counts to predict: a range (1-4, 1..4) or a list (1,2,4)")
    p.add_argument("--deadline", type=float, metavar="SECONDS", help="pick the cheapest P predicted to stop within it")
    p.add_argument("--budget", type=float, metavar="USD", help="pick the fastest P predicted to cost at most this")
    p.add_argument("--from", dest="from_runs", action="append", metavar="RUNDIR",
                   help="fit on this run directory of the job (repeatable; runs at two or more P fit the loss "
                        "curve's scaling); without it, pilot runs are started")
    p.add_argument("--pilot-workers", default=PILOT_WORKERS, metavar="LIST",
                   help=f"worker counts of the pilot runs (default {PILOT_WORKERS})")
    p.add_argument("--pilot-seconds", type=float, default=PILOT_SECONDS, metavar="S",
                   help=f"each pilot run is the job itself, cut at S seconds (default {PILOT_SECONDS:g}): a job that "
                        "stops sooner is measured whole")
    p.add_argument("--pilot-epochs", type=float, metavar="E", help="also cut each pilot run at E epochs")
    p.add_argument("--out", metavar="DIR", help="where the pilot runs go (default: a new temporary directory)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1, metavar="N",
                   help="cores the job's processes share, for the CPU roofline (default: this machine's, %(default)s)")
    p.add_argument("--json", action="store_true", help="print the fit, the predictions and the choice as JSON")
    service_args(p)
    p.set_defaults(func=lambda args: run(args, services))
