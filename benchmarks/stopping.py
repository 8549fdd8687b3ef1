#!/usr/bin/env python
"""Choosing `stop.minDelta` and `stop.patience` (issue #24) on recorded validation curves.

Each of `time_to_quality.py`'s quick sets, and the quickstart (MovieLens under ISP), is trained at P = 1, 2 and 3
with only `model.type` (and the quickstart's protocol) and a long patience
(`--record-patience`, 10), so that the curve goes on past where any candidate rule stops. The stop rule does not
change training before it fires, so every candidate (minDelta, patience) is then replayed on the recorded
evaluations with the supervisor's own `ValidationWatch`: where it stops, and the best evaluation up to there (the
model a job hands back). A candidate passes a run when

- it stops within 30 % of the time of the run's best evaluation plus its patience window (patience × the run's mean
  seconds between evaluations), and
- its final loss is within 0.002 of what today's rule (minDelta 0, patience 5) hands back.

A run whose recording ends before a candidate stops counts as a miss for it.

    python benchmarks/stopping.py [--workers 1,2,3] [--min-deltas 0,0.0005,0.001,0.002] [--patiences 3,5]
                                  [--write-results]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import time_to_quality as ttq  # noqa: E402

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from mlless.stopping.rules import ValidationWatch  # noqa: E402

TODAY = (0.0, 5)
LOSS_SLACK, TIME_SLACK = 0.002, 1.3
#: name: (time_to_quality's set, model type, spec.sync). "movielens-isp" is the quickstart, examples/movielens.yaml.
SETS = {"movielens": ("movielens", "pmf", {}), "movielens-isp": ("movielens", "pmf", {"protocol": "isp"}),
        "pmf1m-skew": ("pmf1m-skew", "pmf", {}), "lr200k": ("lr200k", "logistic-regression", {})}


def record(key: str, workers: int, patience: int, base: Path) -> list[tuple[float, float]]:
    """(seconds, validation loss) of each evaluation of a default job on set `key` (`SETS`)."""
    data_key, kind, sync = SETS[key]
    data = ttq.prepared(base, data_key)
    name = f"stop-{key}-{workers}"
    job = base / "stopping" / f"{name}.yaml"
    job.parent.mkdir(parents=True, exist_ok=True)
    job.write_text(yaml.safe_dump({"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob",
                                   "metadata": {"name": name},
                                   "spec": {"workers": workers, "model": {"type": kind}, "sync": sync,
                                            "dataset": {"uri": str(data), "cacheBatches": True},
                                            "stop": {"patience": patience, "maxEpochs": 50}}}))
    run = _common.mlless_train(job, base / "stopping" / name, services=False)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # a step's row repeats the newest evaluation's loss: an evaluation is where it changes
    losses = [(r["time"], r["validation_loss"]) for r in rows if r["validation_loss"] is not None]
    return [(t, loss) for k, (t, loss) in enumerate(losses) if k == 0 or loss != losses[k - 1][1]]


def replay(curve: list[tuple[float, float]], min_delta: float, patience: int) -> tuple[int | None, float]:
    """The evaluation at which (min_delta, patience) stops (None: not within the recording), and the best loss up to
    it."""
    watch = ValidationWatch(patience, None, 1, min_delta)
    for k, (_, loss) in enumerate(curve):
        watch.observe(k, loss, np.zeros(1, np.float32))
        if watch.patience_exhausted():
            return k, min(loss for _, loss in curve[:k + 1])
    return None, min(loss for _, loss in curve)


def judge(curve: list[tuple[float, float]], min_delta: float, patience: int) -> dict[str, object]:
    times = [t for t, _ in curve]
    best_at = times[int(np.argmin([loss for _, loss in curve]))]
    window = patience * (times[-1] - times[0]) / max(1, len(times) - 1)
    stop, final = replay(curve, min_delta, patience)
    _, today = replay(curve, *TODAY)
    stopped_at = None if stop is None else times[stop]
    ok = stopped_at is not None and stopped_at <= TIME_SLACK * (best_at + window) and final <= today + LOSS_SLACK
    return {"stop": stopped_at, "bound": TIME_SLACK * (best_at + window), "final": final, "today": today, "ok": ok}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,3")
    parser.add_argument("--min-deltas", default="0,0.0005,0.001,0.002,0.005")
    parser.add_argument("--patiences", default="3,5")
    parser.add_argument("--record-patience", type=int, default=10)
    parser.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR)
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    info = _common.machine_info()
    candidates = [(float(d), int(p)) for p in args.patiences.split(",") for d in args.min_deltas.split(",")]
    curves = {(key, w): record(key, w, args.record_patience, args.data_dir)
              for key in SETS for w in map(int, args.workers.split(","))}
    rows = []
    for (key, workers), curve in curves.items():
        for min_delta, patience in candidates:
            j = judge(curve, min_delta, patience)
            rows.append([key, workers, min_delta, patience, j["stop"], j["bound"], j["final"], j["today"],
                         "yes" if j["ok"] else "no"])
    summary = [[d, p, sum(r[8] == "yes" for r in rows if r[2:4] == [d, p]), len(curves)] for d, p in candidates]
    text = "\n".join([
        f"Run: `{_common.command_line()}`; {_common.machine_line(info)}.", "",
        "Each run: seconds to the candidate's stop (– if not within the recording), its bound (1.3 × (best evaluation "
        "+ patience window)), the final loss handed back, today's (minDelta 0, patience 5), and whether it passes.", "",
        _common.table(["set", "P", "minDelta", "patience", "stop s", "bound s", "final", "today", "ok"], rows), "",
        _common.table(["minDelta", "patience", "runs passed", "runs"], summary)])
    print(text)
    if args.write_results:
        _common.update_results("stopping", text)


if __name__ == "__main__":
    main()
