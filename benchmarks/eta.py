#!/usr/bin/env python
"""How right the ETA is (issue #24): its error against the real end at 25, 50 and 75 % progress.

Each of `time_to_quality.py`'s quick sets is trained with only `model.type` (the default job: it stops on patience,
projected on the fitted validation curve, stopping/forecast.py) at each P, and with `--control` also with
a fixed `maxEpochs` (the ETA of a limit known in advance: only the pace is estimated). While `mlless train` runs, a
watcher reads the run directory's `status.json` every 20 ms, as a user's `watch` would; the real end is when the
final status (progress 1, with the model's URI) appears. At the first status at or past each progress mark, the
ETA's error is |ETA - real time left| / real time left (a signed figure in the table: positive, the ETA was late).
The ETA is the time until the stop rule fires; the job's wind-down after it (the final replicas handed in, merged,
evaluated on the whole validation split and saved) is not in it, so the error is also given against the close of
the last step (from metrics.jsonl, on the watcher's clock by the summary's `wall_seconds` at the final status).
Its steadiness is read over every status: how far each one's projected end (its second plus its ETA) was from the
real end, as a mean |log| of their ratio, and how many projected past twice the real end.

With `--repeats N` the whole set of jobs is run N times over, each time on its own `spec.seed` (1, 2, ...), and
two figures come beside the count of runs within 20 %:
- the median |error| at 50 % over every run (a run with no status at 50 % counts as an infinite error);
- the same for a reference that knew the job's end on the other seeds: its ETA is their mean end less the second,
  its 50 % mark half that end. It reads no curve, so its error is the job's own seed-to-seed scatter; an ETA
  can beat it only by what the run itself says of its stop (`eta_replay.py`'s "other-seeds" column, live). It is
  asked twice: at half its end, and at the second of the ETA's own first status at 50 %. The second is the fair
  comparison: half the end is mostly start-up, and the ETA's 50 % is of the training, later, with less time left.

    python benchmarks/eta.py [--sets movielens,pmf1m-skew,lr200k] [--workers 1,2] [--control 3] [--repeats 3]
                             [--write-results]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import time_to_quality as ttq  # noqa: E402

import yaml  # noqa: E402

MARKS = (0.25, 0.5, 0.75)
TARGET = 0.20  # the error at 50 % (issue #24)
KINDS = {"movielens": "pmf", "pmf1m-skew": "pmf", "lr200k": "logistic-regression",
         "pmf10m-skew": "pmf", "lr": "logistic-regression"}  # the last two: time_to_quality's full-size sets


def watched_run(job: Path, run: Path) -> tuple[list[tuple[float, dict]], float, float]:
    """(seconds since start, status) of each new status.json seen, the second its final status appeared, and the
    second the last step closed."""
    seen: list[tuple[float, dict]] = []
    started = time.monotonic()
    proc = subprocess.Popen(_common.mlless_train_command(job, run, services=False))
    path = run / "status.json"
    while True:
        running = proc.poll() is None
        if path.exists():
            status = json.loads(path.read_text())
            if not seen or status != seen[-1][1]:
                seen.append((time.monotonic() - started, status))
        if not running:
            break
        time.sleep(0.02)
    if proc.returncode != 0:
        raise SystemExit(f"mlless train {job} exited {proc.returncode}")
    end = next(t for t, s in seen if "modelURI" in s)
    summary = json.loads((run / "summary.json").read_text())
    last_row = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    return seen, end, end - summary["wall_seconds"] + last_row["time"]


def first_at(seen: list[tuple[float, dict]], mark: float) -> tuple[float, dict] | None:
    """The first status with an ETA at or past progress `mark`, before the final one, and its second."""
    return next(((t, s) for t, s in seen if "modelURI" not in s and s.get("progress", 0) >= mark
                 and s.get("etaSeconds") is not None), None)


def errors(seen: list[tuple[float, dict]], end: float) -> dict[float, tuple[float, str] | None]:
    """At each mark: the signed relative error of the ETA of the first status at or past it, and the limit it named."""
    out: dict[float, tuple[float, str] | None] = {}
    for mark in MARKS:
        at = first_at(seen, mark)
        out[mark] = None if at is None or end - at[0] <= 0 else (
            (at[1]["etaSeconds"] - (end - at[0])) / (end - at[0]), at[1].get("progressLimit", "?"))
    return out


def band_at_half(seen: list[tuple[float, dict]], end: float) -> tuple[float, float] | None:
    """The band of the first status at or past 50 % (etaLowSeconds to etaHighSeconds) as errors against the real time
    left, as the ETA's error is read; None where it had no band (a limit known in advance)."""
    at = first_at(seen, 0.5)
    if at is None or "etaLowSeconds" not in at[1] or end - at[0] <= 0:
        return None
    left = end - at[0]
    return (at[1]["etaLowSeconds"] - left) / left, (at[1]["etaHighSeconds"] - left) / left


def steadiness(seen: list[tuple[float, dict]], end: float) -> tuple[float, int, int] | None:
    """(mean |log(projected end / real end)|, statuses whose projected end was past twice the real one, statuses)
    over every status with an ETA before the final one: the projected end is its second plus its ETA."""
    ratios = [(t + s["etaSeconds"]) / end for t, s in seen
              if "modelURI" not in s and s.get("etaSeconds") is not None and 0 < t < end]
    if not ratios:
        return None
    return sum(abs(math.log(r)) for r in ratios) / len(ratios), sum(r > 2 for r in ratios), len(ratios)


def other_seeds(ends: list[float], i: int, at: float | None = None) -> float | None:
    """The error of an ETA that knew the mean end of the other runs of run `i`'s job, asked at second `at` (by
    default half that mean end): it says the job ends at the mean (None: the run had ended by then, has no other
    run, or had no status at `at`)."""
    others = ends[:i] + ends[i + 1:]
    if not others:
        return None
    expected = statistics.fmean(others)
    end, at = ends[i], expected / 2 if at is None else at
    return None if at >= end else (expected - end) / (end - at)


def median_abs(values: list[float | None]) -> float:
    """The median |value|, a missing one counted as infinite."""
    return statistics.median(math.inf if v is None else abs(v) for v in values)


def job_file(path: Path, name: str, data: Path, kind: str, workers: int, stop: dict, seed: int | None = None) -> Path:
    spec = {"workers": workers, "model": {"type": kind}, "dataset": {"uri": str(data), "cacheBatches": True}}
    if seed is not None:
        spec["seed"] = seed
    if stop:
        spec["stop"] = stop
    path.write_text(yaml.safe_dump({"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob",
                                    "metadata": {"name": name}, "spec": spec}))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="movielens,pmf1m-skew,lr200k")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--control", type=float, default=None, metavar="EPOCHS",
                    help="also run each set at P = 2 with stop.maxEpochs EPOCHS (a limit known in advance)")
    ap.add_argument("--repeats", type=int, default=1, metavar="N",
                    help="run every job N times, on seeds 1..N, and compare with the other seeds' mean end")
    ap.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR)
    ap.add_argument("--write-results", action="store_true")
    ap.add_argument("--section", default="eta", help="the RESULTS.md section written (default eta)")
    args = ap.parse_args()
    info = _common.machine_info()
    rows, misses, halves, bands = [], [], [], []
    runs: dict[tuple[str, int, str], list[tuple[float, float | None]]] = {}  # (end, second of its 50 % status)
    seeds = [None] if args.repeats <= 1 else list(range(1, args.repeats + 1))
    with tempfile.TemporaryDirectory(prefix="mlless-eta-") as tmp:
        jobs = [(key, p, {}) for key in args.sets.split(",") for p in map(int, args.workers.split(","))]
        jobs += [(key, 2, {"maxEpochs": args.control}) for key in args.sets.split(",")] if args.control else []
        for seed in seeds:  # the whole set once per seed: a drifting load falls on every job alike
            for key, workers, stop in jobs:
                data = ttq.prepared(args.data_dir, key)
                job_kind = "default" if not stop else f"maxEpochs {stop['maxEpochs']:g}"
                name = f"eta-{key}-{workers}-{'default' if not stop else 'epochs'}" + (f"-{seed}" if seed else "")
                job = job_file(Path(tmp) / f"{name}.yaml", name, data, KINDS[key], workers, stop, seed)
                seen, end, stopped = watched_run(job, Path(tmp) / name)
                found = errors(seen, end)
                cells = [f"{e[0]:+.0%} ({e[1]})" if e else "-" for e in found.values()]
                cells += [f"{e[0]:+.0%}" if e else "-" for e in errors(seen, stopped).values()]
                steady = steadiness(seen, end)
                cells += ["-" if steady is None else f"{steady[0]:.2f} ({steady[1]} of {steady[2]} past 2x)"]
                band = band_at_half(seen, end)
                bands.append(band)
                cells += ["-" if band is None else f"{band[0]:+.0%} to {band[1]:+.0%}"]
                rows.append([key, workers, job_kind, *([seed] if seed else []), f"{end:.1f}", f"{end - stopped:.1f}",
                             len(seen), *cells])
                print("  ", rows[-1], flush=True)
                half = found[0.5]
                halves.append(None if half is None else half[0])
                half_second = first_at(seen, 0.5)
                runs.setdefault((key, workers, job_kind), []).append((end, half_second and half_second[0]))
                if half is None or abs(half[0]) > TARGET:
                    misses.append(f"{key} P={workers} {job_kind}{f' seed {seed}' if seed else ''}: "
                                  + ("no status at 50 %" if half is None else f"{half[0]:+.0%}"))
    table = _common.table(["set", "P", "job", *(["seed"] if seeds[0] else []), "end (s)", "wind-down (s)",
                           "statuses", "error at 25 %", "at 50 %", "at 75 %", "vs last step: 25 %", "50 %", "75 %",
                           "steadiness", "band at 50 %"], rows)
    verdict = (f"Target (|error| at 50 % <= {TARGET:.0%}): met in {len(rows) - len(misses)} of {len(rows)} runs"
               + (f"; missed: {'; '.join(misses)}." if misses else "."))
    held = [low <= 0 <= high for low, high in filter(None, bands)]
    verdict += (f" The band at 50 % (the futures' early and late tenth, forecast.BAND) held the real end in "
                f"{sum(held)} of the {len(held)} runs that had one." if held else " No run had a band at 50 %.")
    if len(seeds) > 1:
        ends = {job: [end for end, _ in got] for job, got in runs.items()}
        reference = [other_seeds(ends[job], i) for job, got in runs.items() for i in range(len(got))]
        same_second = [None if at is None else other_seeds(ends[job], i, at)
                       for job, got in runs.items() for i, (_, at) in enumerate(got)]
        by_job = ", ".join(f"{k} P={p}: {min(e):.1f}-{max(e):.1f} s" for (k, p, _), e in ends.items())
        verdict += (f" Median |error| at 50 % over the {len(rows)} runs: **{median_abs(halves):.0%}**; an ETA that "
                    f"knew the other seeds' mean end: {median_abs(reference):.0%} (within {TARGET:.0%} in "
                    f"{sum(r is not None and abs(r) <= TARGET for r in reference)} of {len(reference)}), asked "
                    f"at half its end; asked at the second of the ETA's own first status at 50 %, when less of the "
                    f"job is left (the start-up is behind it): {median_abs(same_second):.0%} (within {TARGET:.0%} in "
                    f"{sum(r is not None and abs(r) <= TARGET for r in same_second)} of {len(same_second)}). "
                    f"The jobs' ends over the seeds: {by_job}.")
    body = "\n".join([
        "## ETA error against the real end (issue #24)", "",
        f"{_common.machine_line(info)}. Command: `{_common.command_line()}`. "
        + ("One run each" if len(seeds) == 1 else f"{len(seeds)} runs each, one per seed, seed by seed")
        + ", all in this one run. "
        f"{_common.load_note(info['load'], _common.loadavg())}", "",
        "Error = (ETA - real time left) / real time left, read from the first status.json at or past each progress "
        "mark (positive: the ETA said later than the job ended), with the limit the progress counted towards; "
        "then against the close of the last step instead of the job's end. End: seconds from `mlless train`'s start "
        "(most of it the start of the processes and the workers' data) to its final status; wind-down: from the "
        "last step's close to then. Steadiness: over every status with an ETA before the final one, the mean "
        "|log(projected end / real end)|, the projected end being the status's second plus its ETA, and how many "
        "statuses projected past twice the real end. Band at 50 %: the first status at 50 %'s etaLowSeconds and "
        "etaHighSeconds as errors against the real time left (it held the end where the first is at or below 0 "
        "and the second at or above).", "",
        table, "", verdict,
    ])
    print(body)
    if args.write_results:
        _common.update_results(args.section, body)


if __name__ == "__main__":
    main()
