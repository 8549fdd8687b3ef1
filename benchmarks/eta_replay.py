#!/usr/bin/env python
"""The patience stop's projection (issue #24), replayed offline on recorded validation curves.

`eta.py` times the ETA of live jobs, one run per set and P, so each way of projecting the stop costs a full rerun,
and the pace's wobble is mixed into its error. This script separates the projection: default jobs (only
`model.type`, so they stop on patience) are recorded once each with a long patience (`--record-patience`) so that
the curve goes on past the default rule's stop; the default rule (`StopConfig()`'s patience and minDelta) is then
replayed on each curve with the supervisor's own `ValidationWatch` to find where the job would have stopped, and
each projection method is asked, after every evaluation before that stop, where it projects the stop. Its error at
a progress mark is that of the first evaluation whose projected progress (step / projected stop) reaches the mark:
(projected steps left - real steps left) / real steps left, which is the ETA's error at a steady pace. Its
steadiness is read over every evaluation before the stop: how many projections leapt past twice the real stop,
and the mean |log(projected / real stop)|.

    python benchmarks/eta_replay.py [--sets movielens,pmf1m-skew,lr200k] [--workers 1,2,3] [--seeds 1,2]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import time_to_quality as ttq  # noqa: E402
from eta import KINDS  # noqa: E402

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from mlless.stopping import forecast  # noqa: E402
from mlless.stopping.rules import ValidationWatch  # noqa: E402
from mlless.spec.job import StopConfig  # noqa: E402
from mlless.spec.schema import DEFAULT_PATIENCE  # noqa: E402
from mlless.telemetry.rows import evaluated  # noqa: E402

MARKS = (0.25, 0.5, 0.75)
Curve = list[tuple[int, float]]


def record(base: Path, key: str, workers: int, seed: int, patience: int) -> tuple[Curve, int]:
    """(step, validation loss) of each evaluation of a default job with a long patience, and its evaluation period;
    cached under `base`."""
    cache = base / "eta-replay" / f"{key}-{workers}-{seed}-{patience}.json"
    if cache.exists():
        got = json.loads(cache.read_text())
        return [tuple(p) for p in got["curve"]], got["every"]
    data = ttq.prepared(base, key)
    name = f"replay-{key}-{workers}-{seed}"
    job = cache.parent / f"{name}.yaml"
    job.parent.mkdir(parents=True, exist_ok=True)
    job.write_text(yaml.safe_dump({"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
                                   "spec": {"workers": workers, "seed": seed, "model": {"type": KINDS[key]},
                                            "dataset": {"uri": str(data), "cacheBatches": True},
                                            "stop": {"patience": patience, "maxEpochs": 50}}}))
    run = _common.mlless_train(job, cache.parent / name, services=False)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    every = json.loads((run / "job.json").read_text())["evaluate_every"]
    # a step's row repeats the newest evaluation; each is taken at the step its snapshot was, as the supervisor's
    # ValidationWatch sees it, not the later one it reached the record at
    curve = [(r["validation_step"], r["validation_loss"]) for r, new in zip(rows, evaluated(rows)) if new]
    cache.write_text(json.dumps({"curve": curve, "every": every}))
    return curve, every


def real_stop(curve: Curve, stop: StopConfig) -> int | None:
    """The step at which the default rule stops on `curve` (None: not within the recording)."""
    watch = ValidationWatch(stop.patience, None, 1, stop.min_delta)
    for step, loss in curve:
        watch.observe(step, loss, np.zeros(1, np.float32))
        if watch.patience_exhausted():
            return step
    return None


Method = Callable[[Curve, StopConfig, int], float | None]


def current(curve: Curve, stop: StopConfig, every: int) -> float | None:
    got = forecast.project_stop([s for s, _ in curve], [x for _, x in curve], stop, every)
    return None if got is None else got.step


def variant(share: float, observed_spacing: bool) -> Method:
    """`forecast.project_stop`'s projection with the curve fitted to another share of the newest evaluations (1: all
    of them, as before session 12; 0.5: sessions 12-13) and the projected evaluations spaced by
    `evaluation.everySteps` (as before session 12) or by the newest evaluations' spacing (as now)."""
    def method(curve: Curve, stop: StopConfig, every: int) -> float | None:
        with mock.patch.multiple(forecast, RECENT_SHARE=share,
                                 SPACING_GAPS=forecast.SPACING_GAPS if observed_spacing else 0):
            return current(curve, stop, every)
    return method


METHODS: dict[str, Method] = {"current": current, "newest-half": variant(0.5, True),
                              "whole-observed": variant(1.0, True), "whole-everySteps": variant(1.0, False)}
#: The reference column: a forecaster told, from the start, where the same job (set and P) stopped on the other
#: seeds (their median). It knows the job's stop as well as the job can be known without this run's curve; its
#: error is the stop's own scatter from seed to seed, which a projection can shrink only by what the curve so far
#: says of this run (a reference, not a bound).
OTHER_SEEDS = "other-seeds"


def other_seeds(stops: dict[tuple[str, int, int], int | None], key: tuple[str, int, int]) -> Method:
    found = [end for (k, p, seed), end in stops.items() if (k, p) == key[:2] and seed != key[2] and end is not None]
    return lambda curve, stop, every: float(np.median(found)) if found else None


Projected = list[tuple[int, float | None]]


def projections(curve: Curve, every: int, stop: StopConfig, method: Method) -> tuple[int, Projected] | None:
    """(the real stop, (step, projected stop or None: no projection yet) after each evaluation before it); None
    when the rule does not stop within the recording."""
    end = real_stop(curve, stop)
    if end is None:
        return None
    seen = [(s, x) for s, x in curve if s < end]
    found = [(seen[k - 1][0], method(seen[:k], stop, every)) for k in range(1, len(seen) + 1)]
    return end, [(step, None if projected is None else max(projected, step + 1)) for step, projected in found]


def first_at(projected: Projected, mark: float) -> tuple[int, float] | None:
    """(step, projected stop) of the first projection whose progress reaches `mark`."""
    return next(((step, stop) for step, stop in projected if stop is not None and step / stop >= mark), None)


def errors(end: int, projected: Projected) -> dict[float, float | None]:
    """The error, in steps left, at the first projection whose progress reaches each of MARKS."""
    out: dict[float, float | None] = {}
    for mark in MARKS:
        at = first_at(projected, mark)
        out[mark] = None if at is None else ((at[1] - at[0]) - (end - at[0])) / (end - at[0])
    return out


def steadiness(found: list[tuple[int, Projected] | None]) -> str:
    """How far every projection before the stop strayed (a steady ETA does not leap to several times the job's
    length for an evaluation or two and back), and how many evaluations had one (before, the ETA is another
    limit's: `maxEpochs`, far off for these jobs)."""
    pairs = [(stop, end) for end, projected in filter(None, found) for _, stop in projected]
    ratios = [stop / end for stop, end in pairs if stop is not None]
    if not ratios:
        return "-"
    return (f"a projection at {len(ratios)} of {len(pairs)} evaluations; {sum(r > 2 for r in ratios)} past twice "
            f"the real stop, mean |log(projected / real)| {np.mean(np.abs(np.log(ratios))):.3f}")


def futures_at_half(curve: Curve, every: int, stop: StopConfig) -> tuple[bool, float] | None:
    """At the first evaluation whose projected progress reaches 50 %: whether `forecast.project_stop`'s band (its
    futures' early and late stops, `forecast.BAND`) held the real stop, and the share of its futures whose stop the
    projection (their median) was within 20 % of, in steps left: how often the ETA would be within 20 % if the job
    were one of its own futures (None: no stop, or no futures there)."""
    fitted: dict[int, forecast.StopProjection | None] = {}

    def keeping(seen: Curve, stop: StopConfig, every: int) -> float | None:  # `current`, its projections kept
        fitted[seen[-1][0]] = got = forecast.project_stop([s for s, _ in seen], [x for _, x in seen], stop, every)
        return None if got is None else got.step

    found = projections(curve, every, stop, keeping)
    at = None if found is None else first_at(found[1], 0.5)
    got = None if at is None else fitted[at[0]]
    if found is None or at is None or got is None or got.band is None:
        return None
    end, step = found[0], at[0]
    close = np.mean([abs(got.step - f) <= 0.2 * (f - step) for f in got.futures])
    return got.band[0] <= end <= got.band[1], float(close)


def summary(found: list[float | None]) -> str:
    """'within 20 % in k of n, median |error| m' of errors at 50 % (None: never reached the mark)."""
    got = [abs(e) for e in found if e is not None]
    return (f"within 20 % in {sum(e <= 0.2 for e in got)} of {len(found)}, median |error| "
            f"{np.median(got):.0%}" if got else "-")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="movielens,pmf1m-skew,lr200k", help=f"of {', '.join(KINDS)}")
    ap.add_argument("--workers", default="1,2,3")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--record-patience", type=int, default=15)
    ap.add_argument("--methods", default=None, help="comma-separated; default: all")
    ap.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR)
    ap.add_argument("--write-results", action="store_true")
    ap.add_argument("--section", default="eta-replay", help="the RESULTS.md section written (default eta-replay)")
    args = ap.parse_args()
    stop = replace(StopConfig(), patience=DEFAULT_PATIENCE)
    methods = args.methods.split(",") if args.methods else list(METHODS)
    columns = [*methods, OTHER_SEEDS]
    curves = {(key, p, seed): record(args.data_dir, key, p, seed, args.record_patience)
              for key in args.sets.split(",") for p in map(int, args.workers.split(","))
              for seed in map(int, args.seeds.split(","))}
    stops = {key: real_stop(curve, stop) for key, (curve, _) in curves.items()}
    rows, halves, projected = [], {name: [] for name in columns}, {name: [] for name in columns}
    for (key, p, seed), (curve, every) in curves.items():
        pick = {**METHODS, OTHER_SEEDS: other_seeds(stops, (key, p, seed))}
        cells = []
        for name in columns:
            got = projections(curve, every, stop, pick[name])
            projected[name].append(got)
            half = None if got is None else errors(*got)[0.5]
            halves[name].append(half)
            cells.append("-" if half is None else f"{half:+.0%}")
        rows.append([key, p, seed, len(curve), stops[key, p, seed] or "-", *cells])
    keys = list(curves)
    futures = {key: futures_at_half(curve, every, stop) for key, (curve, every) in curves.items()}

    def count(sets: set[str]) -> str:
        got = [f for key, f in futures.items() if key[0] in sets and f is not None]
        return (f"{sum(held for held, _ in got)} of {len(got)} (the median within 20 % of "
                f"{np.mean([close for _, close in got]):.0%} of their futures)") if got else "-"
    lines_band = (f"the band of `current` (its futures' {forecast.BAND:.0%} to {1 - forecast.BAND:.0%} stops), at its "
                  f"50 % mark on the curves with a band there, held the real stop in {count({k for k, *_ in keys})}; "
                  "by set: "
                  + ", ".join(f"{k} {count({k})}" for k in dict.fromkeys(k for k, *_ in keys)))
    lines = [f"{name}: {summary(got)}; by set: " + ", ".join(
                 f"{k} {summary([e for key, e in zip(keys, got) if key[0] == k])}" for k in dict.fromkeys(k for k, *_ in keys))
             + f"; over every evaluation before the stop: {steadiness(projected[name])}"
             for name, got in halves.items() if any(e is not None for e in got)]
    body = "\n".join([
        "## The patience stop's projection, replayed on recorded curves (`benchmarks/eta_replay.py`, issue #24)", "",
        f"`{_common.command_line()}`; {_common.machine_line(_common.machine_info())}.", "",
        f"Recorded default jobs with patience {args.record_patience}; the default rule (patience {stop.patience}, "
        f"minDelta {stop.min_delta:g}) replayed on each gives the real stop (step). Error at 50 % progress of each "
        "method, in steps left (the ETA's at a steady pace): " + ", ".join(methods) + f"; {OTHER_SEEDS}: the median "
        "real stop of the same set and P on the other seeds, known from the start (its error is the stop's own "
        "scatter from seed to seed).", "",
        _common.table(["set", "P", "seed", "evaluations", "real stop", *columns], rows), "",
        *[f"- {line}" for line in [*lines, lines_band]]])
    print(body)
    if args.write_results:
        _common.update_results(args.section, body)

if __name__ == "__main__":
    main()
