"""What one run directory of `mlless train` tells the planner: `RunMeasure`.

It reads the run record (`telemetry/record.py`): `summary.json` (start-up, steps, samples, the stop reason, the
workers) and `metrics.jsonl` (one `telemetry.rows.StepRow` a step: time, samples, bytes, the phases of
`telemetry/timing.py`, and the validation loss of the newest evaluated snapshot), plus `job.json` (the resolved job
the run trained). A run whose worker count changed (the auto-tuner) or that failed is refused: the model needs
one P a run.
"""
from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlless.contract import STOP_DIVERGED
from mlless.spec import SpecError, TrainingJob
from mlless.telemetry.record import EXPORTED
from mlless.telemetry.rows import evaluated

#: A worker's own work on its mini-batch, and the exchange that follows it (`mlless.contract.STEP_PHASES`).
LOCAL_PHASES = ("fetch", "compute", "filter")
EXCHANGE_PHASES = ("write", "read", "apply")
#: Steps a run needs before its step time means anything.
MIN_STEPS = 3
#: The newest share of a run's steps whose step time a job training past the run is taken to keep.
NEWEST_SHARE = 1 / 3


class PlanError(Exception):
    """Input the planner cannot use (a run directory, a deadline, the worker range); one line, no traceback."""


@dataclass(frozen=True)
class RunMeasure:
    run_dir: Path
    workers: int
    model: str
    protocol: str
    evaluate_every: int  # the run's evaluation.everySteps
    batch: float  # samples a worker trains per step
    batches_per_epoch: float
    startup: float  # seconds before the first step
    wind_down: float  # seconds after the last step's close: the final evaluation, the model written
    steps: int
    samples: int
    stop_reason: str
    step_seconds: float  # mean, first step to last: evaluations and every other pause included
    step_plain: float  # the mean step away from evaluations
    step_newest: float  # the same over the newest NEWEST_SHARE of the steps
    evaluation_extra: float  # the seconds each evaluation adds to the steps around it
    local: float  # median seconds of a worker's fetch + compute + filter
    exchange: float | None  # median seconds of write + read + apply, where the barrier phases are known
    sent: float  # mean bytes a worker sends per step
    read: float  # mean bytes a worker reads per step
    evaluations: tuple[tuple[int, float], ...]  # (samples trained, validation loss) at each new evaluation

    def evaluation_spacing(self, evaluate_every: int) -> float:
        """Steps between evaluations had the run evaluated every `evaluate_every` steps (0: never). An evaluation
        comes no sooner than `everySteps`, a round's end (PMF's blocked rounds) and the supervisor's time share
        (`Evaluation.due`) allow: what spaced the run's out past its cadence spaces a job's that evaluates less
        often too (a MovieLens pilot at P = 1, every 18 steps, evaluated every 34, as its job every 25 did every
        32). A job that evaluates more often than the run: the run's spacing scaled by the cadences."""
        if not evaluate_every or not self.evaluations:
            return float(evaluate_every)
        spacing = self.steps / len(self.evaluations)
        if evaluate_every >= self.evaluate_every:
            return max(float(evaluate_every), spacing)
        return max(1.0, evaluate_every * spacing / self.evaluate_every)

    def step_at_cadence(self, evaluate_every: int) -> float:
        """The mean step had the run evaluated every `evaluate_every` steps (a pilot evaluates more often than its
        job): the steps without an evaluation, plus each evaluation's extra time, spaced as `evaluation_spacing`."""
        if evaluate_every == self.evaluate_every or not self.evaluations:
            return self.step_seconds
        spacing = self.evaluation_spacing(evaluate_every)
        return self.step_plain + (self.evaluation_extra / spacing if spacing else 0.0)

    def step_through(self, samples: float, evaluate_every: int) -> float:
        """The mean step of a job at this P that trains `samples`: the run's own as far as it went, then its newest
        steps' (away from evaluations; the evaluations' extra as before). A step can fall as a job runs: the
        significance filter sends less as the updates shrink, so a pilot's mean alone overstates the job's."""
        here = self.step_at_cadence(evaluate_every)
        if samples <= self.samples:
            return here
        later = here - self.step_plain + self.step_newest
        return (self.samples * here + (samples - self.samples) * later) / samples


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError:
        raise PlanError(f"{path.parent}: no {path.name}: not the run directory of a finished `mlless train`") from None
    except ValueError as exc:
        raise PlanError(f"{path}: not JSON ({exc})") from None


def _rows(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        raise PlanError(f"{path.parent}: no {path.name}: not the run directory of a finished `mlless train`") from None
    try:
        return [json.loads(line) for line in lines if line.strip()]
    except ValueError as exc:
        raise PlanError(f"{path}: a line is not JSON ({exc})") from None


def _new_evaluations(rows: list[dict[str, Any]], new: list[bool]) -> list[tuple[int, float]]:
    """(samples trained, loss) of each new evaluation, at the step its snapshot was taken (in an older record, at
    the step it arrived)."""
    samples = list(itertools.accumulate(r["samples"] for r in rows))
    at_step = dict(zip((r["step"] for r in rows), samples))
    return [(at_step.get(r.get("validation_step"), n), float(r["validation_loss"]))
            for n, r, fresh in zip(samples, rows, new) if fresh]


def _step_times(rows: list[dict[str, Any]], new: list[bool]) -> tuple[float, float, float]:
    """(the mean step away from evaluations, the same over the newest steps, the extra seconds each evaluation
    costs): the step whose close brought a new evaluation and the one after it are both slower (by 15 and 3.5 ms in
    a MovieLens run at P = 2)."""
    times = [(b["time"] - a["time"], now or was) for a, b, now, was in zip(rows, rows[1:], new[1:], new)]

    def plain_mean(span: list[tuple[float, bool]]) -> float:
        return statistics.fmean([dt for dt, near in span if not near] or [dt for dt, _ in span])

    base = plain_mean(times)
    newest = plain_mean(times[min(len(times) - 1, int(len(times) * (1 - NEWEST_SHARE))):])
    count = sum(new[1:])
    return base, newest, max(0.0, sum(dt - base for dt, near in times if near) / count) if count else 0.0


def measure(run_dir: str | Path) -> RunMeasure:
    """The run's measures; PlanError naming the directory and what is missing from it."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise PlanError(f"{run_dir}: no such run directory")
    summary = _read_json(run_dir / EXPORTED[1])
    rows = _rows(run_dir / EXPORTED[2])
    try:
        job = TrainingJob.from_json((run_dir / "job.json").read_text())
    except OSError:
        raise PlanError(f"{run_dir}: no job.json: not the run directory of `mlless train`") from None
    except (SpecError, ValueError, TypeError, KeyError) as exc:
        raise PlanError(f"{run_dir}/job.json: not a resolved job ({exc})") from None
    try:
        return _measure(run_dir, summary, rows, job)
    except (KeyError, TypeError) as exc:
        raise PlanError(f"{run_dir}: its record lacks {exc} (written by an older mlless?)") from None


def _measure(run_dir: Path, summary: dict[str, Any], rows: list[dict[str, Any]], job: TrainingJob) -> RunMeasure:
    reason = summary["stop_reason"] or ""
    if reason == STOP_DIVERGED:
        raise PlanError(f"{run_dir}: the run diverged; plan from one that trained")
    if summary.get("scaling_events"):
        raise PlanError(f"{run_dir}: its workers changed during the run (auto-tuner); plan from runs at a fixed P")
    if len(rows) < MIN_STEPS:
        raise PlanError(f"{run_dir}: {len(rows)} step rows in metrics.jsonl; the planner needs {MIN_STEPS} or more")
    workers = int(summary["workers_initial"])
    batch = statistics.median(r["samples"] / max(1, r["workers"]) for r in rows)
    last = rows[-1]
    samples = sum(r["samples"] for r in rows)
    barrier = [r for r in rows if r["phases"].get("read") is not None]
    read = [r["bytes_read"] / max(1, r["workers"]) for r in rows if r.get("bytes_read") is not None]
    new = evaluated(rows)
    plain, newest, extra = _step_times(rows, new)
    return RunMeasure(
        run_dir=run_dir,
        workers=workers,
        model=job.model.type,
        protocol=job.sync.protocol,
        evaluate_every=job.evaluate_every,
        batch=batch,
        batches_per_epoch=samples / batch / last["epoch"] if last["epoch"] > 0 else float(workers),
        startup=float(summary["startup_seconds"]),
        wind_down=max(0.0, float(summary["wall_seconds"]) - last["time"]),
        steps=int(last["step"]),
        samples=samples,
        stop_reason=reason,
        step_seconds=(last["time"] - rows[0]["time"]) / (len(rows) - 1),
        step_plain=plain,
        step_newest=newest,
        evaluation_extra=extra,
        local=statistics.median(sum(r["phases"][p] or 0.0 for p in LOCAL_PHASES) for r in rows),
        exchange=statistics.median(sum(r["phases"][p] or 0.0 for p in EXCHANGE_PHASES) for r in barrier)
        if barrier else None,
        sent=statistics.fmean(r["bytes_sent"] / max(1, r["workers"]) for r in rows),
        read=statistics.fmean(read) if read else 0.0,
        evaluations=tuple(_new_evaluations(rows, new)),
    )
