"""What the ETA's projection costs the supervisor (issue #24): `forecast.project_stop`'s time, alone and in jobs.

The supervisor's step closes wait on each projection, and `eta.REFIT_SHARE` lets fits take at most 5 % of its
time, so a projection's cost decides how often the ETA is refitted. Two measures:
- alone: the median time of `project_stop` on one synthetic MovieLens-like curve (an evaluation every 32 steps,
  flattening, then turning up) cut after 8 to 30 evaluations, the median over the cuts;
- in a job: the default job (`model.type` only) of `time_to_quality.py`'s quick sets at each P, run by `mlless
  train` in a child process whose `project_stop` is timed: how many fits the job made, at which evaluations, and
  what the first one and the median one took.

    python benchmarks/projection_cost.py [--sets movielens,pmf1m-skew] [--workers 1] [--runs 3] [--write-results]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import _common
import time_to_quality as ttq
from eta import KINDS, job_file

CUTS = range(8, 31)
REPEATS = 15


def alone() -> float:
    """Median over the cuts of the median time (ms) of one projection."""
    from mlless.stopping.forecast import project_stop
    from mlless.spec.job import StopConfig

    steps = np.arange(1, 31) * 32.0
    loss = (0.86 + 0.5 / (1 + steps / 60) + 0.0005 * np.maximum(steps - 400, 0) / 32
            + np.random.default_rng(1).normal(0, 0.002, steps.size))
    stop, per_cut = StopConfig(patience=5, min_delta=0.001), []
    for n in CUTS:
        project_stop(steps[:n], loss[:n], stop, 25)
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            project_stop(steps[:n], loss[:n], stop, 25)
            times.append(time.perf_counter() - start)
        per_cut.append(statistics.median(times) * 1e3)
    return statistics.median(per_cut)


def child(job: str, run_dir: str) -> None:
    """Run `mlless train` here with `project_stop` timed; print one JSON line of (evaluations, ms) per projection."""
    import mlless.runtime.supervisor.eta as eta
    from mlless.cli import main as mlless

    projected, timed = eta.project_stop, []

    def project_stop(steps, losses, *args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        out = projected(steps, losses, *args, **kwargs)
        timed.append((len(steps), (time.perf_counter() - start) * 1e3, out is not None and out.curve is not None))
        return out

    eta.project_stop = project_stop
    try:
        mlless(["train", job, "--out", run_dir, "-q"])
    except SystemExit:
        pass
    print(json.dumps([(n, ms) for n, ms, fitted in timed if fitted]))


def in_job(job: Path, run_dir: Path) -> list[tuple[int, float]]:
    out = subprocess.run([sys.executable, __file__, "--child", str(job), str(run_dir)], check=True,
                         capture_output=True, text=True).stdout
    return [tuple(x) for x in json.loads(out.strip().splitlines()[-1])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="movielens,pmf1m-skew")
    ap.add_argument("--workers", default="1")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR)
    ap.add_argument("--write-results", action="store_true")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    info = _common.machine_info()
    rows = []
    with tempfile.TemporaryDirectory(prefix="mlless-projection-") as tmp:
        for key in args.sets.split(","):
            for workers in map(int, args.workers.split(",")):
                data = ttq.prepared(args.data_dir, key)
                for run in range(1, args.runs + 1):
                    name = f"cost-{key}-{workers}-{run}"
                    job = job_file(Path(tmp) / f"{name}.yaml", name, data, KINDS[key], workers, {})
                    fits = in_job(job, Path(tmp) / name)
                    ms = [m for _, m in fits]
                    rows.append([key, workers, run, len(fits), ", ".join(str(n) for n, _ in fits),
                                 f"{ms[0]:.1f}" if ms else "-", f"{statistics.median(ms):.1f}" if ms else "-"])
                    print("  ", rows[-1], flush=True)
    body = "\n".join([
        "## The projection's cost (`benchmarks/projection_cost.py`, issue #24)", "",
        f"{_common.machine_line(info)}. Command: `{_common.command_line()}`. "
        f"{_common.load_note(info['load'], _common.loadavg())}", "",
        f"Alone: one projection took **{alone():.1f} ms** (the median over cuts after 8-30 evaluations of one "
        "synthetic curve). In jobs: the default job's fits of its validation curve, timed inside its supervisor.", "",
        _common.table(["set", "P", "run", "fits", "at evaluations", "first (ms)", "median (ms)"], rows),
    ])
    print(body)
    if args.write_results:
        _common.update_results("projection-cost", body)


if __name__ == "__main__":
    main()
