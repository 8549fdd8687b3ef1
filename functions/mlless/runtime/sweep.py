"""`mlless sweep`: a TrainingSweep's trials on this machine, each a normal local job in its own run directory.

A trial is `train_local` in a thread of this process: its supervisor here, its workers OS processes, its own job id,
key and (without services) embedded broker, so trials share nothing but their dataset and the zygote their workers
are forked from (launch/zygote.py): its start is paid once for the sweep, billed to the first trial's first worker.
The sweep reads each trial's metrics.jsonl as the supervisor writes it (line-buffered) and stops an ASHA loser with
`Supervisor.request_stop`: the trial ends at its next step close as if a stop rule had fired, its workers hand in
their replicas, and its summary and model (the best snapshot) are written.
"""
from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from mlless.contract import STOP_ASHA, STOP_SWEEP_BUDGET, STOP_SWEEP_INTERRUPTED, SWEEP_FILE
from mlless.contract import SWEEP_BEST_DIR as BEST_DIR, SWEEP_TRIALS_DIR as TRIALS_DIR
from mlless.progress import Progress
from mlless.runtime.local import Services, job_zygote, train_local
from mlless.runtime.supervisor.failover import failed
from mlless.runtime.supervisor.loop import Supervisor
from mlless.launch.zygote import Zygote
from mlless.sweep.asha import judge, reach, rung_values
from mlless.sweep.manifest import EarlyStopping, Sweep
from mlless.sweep.status import Trial, best_trial, sweep_status, write_status
from mlless.telemetry.record import RunRecord

#: How often the sweep reads its trials' records and judges them when no trial wakes it. A trial wakes it with the
#: row that reaches a rung (`TrialRun.row_written`) and as it ends, because a loser trains, and is billed, until the
#: sweep looks: polled every 50 ms alone, a MovieLens trial of benchmarks/forecast.py (a millisecond a step) trained
#: 0.05-0.4 epochs past its rung.
POLL_SECONDS = 0.05
#: How often status.json is rewritten while the sweep runs.
STATUS_SECONDS = 0.5


class TrialRun:
    """One trial's thread, its supervisor once it exists, and what the sweep has read of its record."""

    def __init__(self, trial: Trial, run_dir: Path, rule: EarlyStopping, limit: float | None,
                 wake: threading.Event) -> None:
        self.trial = trial
        self.run_dir = run_dir
        self.rule = rule
        self.resource = rule.field  # the row field ASHA counts: step or epoch
        self.limit = limit  # where the trial's own stop rule ends it, in that resource, if it says
        self.wake = wake  # set to have the sweep look now
        self._best = math.inf  # of the rows written so far (`row_written`) ...
        self._reached: list[float] = []  # ... and its values at the rungs they reached
        self.curve: list[tuple[float, float | None]] = []
        self.summary: dict[str, Any] | None = None
        self.error: str | None = None
        self.ended = False  # its `train_local` returned or raised
        self._offset = 0
        self._lock = threading.Lock()
        self._supervisor: Supervisor | None = None
        self._stop: str | None = None
        self.thread: threading.Thread | None = None

    def attach(self, supervisor: Supervisor) -> None:
        supervisor.record.listen(self.row_written)
        with self._lock:
            self._supervisor = supervisor
            if self._stop is not None:
                supervisor.request_stop(self._stop)

    def stop(self, reason: str) -> None:
        """End the trial at its next step close; once only."""
        with self._lock:
            if self._stop is not None:
                return
            self._stop = reason
            if self._supervisor is not None:
                self._supervisor.request_stop(reason)

    def row_written(self, line: str) -> None:
        """A row of the trial's record was written (in its supervisor's thread): wake the sweep when the trial reached
        a rung with it (`asha.reach`, as `rung_values` counts rungs). Only then: each look holds the GIL its
        supervisor needs."""
        if not self.rule.enabled:
            return
        row = json.loads(line)
        loss = row["validation_loss"]
        if loss is not None and math.isfinite(loss):
            self._best = min(self._best, loss)
        reached = len(self._reached)
        reach(self.rule, self._reached, row[self.resource], self._best, self.limit)
        if len(self._reached) > reached:
            self.wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop is not None

    def stopped_by_sweep(self, summary: dict[str, Any]) -> bool:
        """The trial ended on the sweep's stop, not on a rule of its own that fired first."""
        return self._stop is not None and summary["stop_reason"] == self._stop

    def read(self) -> None:
        """Take in the record's new complete rows."""
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return
        with path.open("rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            row = json.loads(line)
            self.trial.step = row["step"]
            self.trial.cost_usd = row["cost_usd"]
            self.trial.observe_loss(row["validation_loss"])
            self.curve.append((row[self.resource], row["validation_loss"]))


class LocalSweep:
    def __init__(self, sweep: Sweep, out: Path, services: Services, say: Callable[[str], None]) -> None:
        self.sweep = sweep
        self.out = out
        self.services = services
        self.say = say
        self.rule = sweep.early_stopping
        self.trials = [Trial(sweep.trial_name(i), values) for i, values in enumerate(sweep.assignments())]
        self.runs: dict[str, TrialRun] = {}
        self.message: str | None = None
        self.zygote: Zygote | None = None
        self.wake = threading.Event()

    def run(self) -> dict[str, Any]:
        """Run the trials to the end; returns the final status (also in status.json)."""
        (self.out / TRIALS_DIR).mkdir(parents=True, exist_ok=True)
        (self.out / SWEEP_FILE).write_text(json.dumps(
            {"name": self.sweep.name, "earlyStopping": asdict(self.rule), "budgetUSD": self.sweep.budget_usd,
             "parameters": [p.field for p in self.sweep.parameters],
             "trials": {t.name: t.parameters for t in self.trials}}, indent=2) + "\n")
        with job_zygote(self.sweep.template["model"]["type"]) as self.zygote:
            return self._run()

    def _run(self) -> dict[str, Any]:
        written = -float("inf")
        try:
            while self._step():
                if time.monotonic() - written >= STATUS_SECONDS:
                    write_status(self.out, sweep_status("Running", self.trials))
                    written = time.monotonic()
                self.wake.wait(POLL_SECONDS)
                self.wake.clear()
        except KeyboardInterrupt:
            self._stop_all(STOP_SWEEP_INTERRUPTED)
            self._drain()
            write_status(self.out, sweep_status("Failed", self.trials, "interrupted"))
            raise
        status = sweep_status("Succeeded", self.trials, self.message)
        best = best_trial(self.trials)
        if best is not None:
            status["bestModelURI"] = self._copy_best(best)
        write_status(self.out, status)
        return status

    def _step(self) -> bool:
        """One look at the trials: read, judge, finish, start (the slots just freed too); False once every trial is
        over."""
        for run in list(self.runs.values()):
            run.read()
            if self.rule.enabled:
                run.trial.rung_losses = rung_values(self.rule, run.curve, run.limit)
        if self.rule.enabled:
            self._judge()
        for name, run in list(self.runs.items()):
            if run.ended:
                self._finish(run)
                del self.runs[name]
        spent = sum(t.cost_usd for t in self.trials)
        if self.sweep.budget_usd is not None and spent >= self.sweep.budget_usd:
            if self.message is None:
                self.message = f"budget spent: ${spent:.5f} of ${self.sweep.budget_usd:g}; the trials not started never ran"
                self._stop_all(STOP_SWEEP_BUDGET)
        else:
            self._start_trials()
        return bool(self.runs) or (self.message is None and any(t.state == "Pending" for t in self.trials))

    def _start_trials(self) -> None:
        for trial in self.trials:
            if len(self.runs) >= self.sweep.max_concurrent:
                return
            if trial.state != "Pending":
                continue
            run = TrialRun(trial, self.out / TRIALS_DIR / trial.name, self.rule,
                           self.sweep.trial_limit(trial.name, trial.parameters), self.wake)
            run.thread = threading.Thread(target=self._train, args=(run,), name=trial.name, daemon=True)
            trial.state = "Running"
            self.runs[trial.name] = run
            run.thread.start()
            self.say(f"trial {trial.name} started: " + ", ".join(f"{k} {v}" for k, v in trial.parameters.items()))

    def _train(self, run: TrialRun) -> None:
        try:
            job = self.sweep.trial_job(run.trial.name, run.trial.parameters)
            run.summary = train_local(job, run.run_dir, self.services, Progress(enabled=False), on_start=run.attach,
                                      zygote=self.zygote)
        except Exception as exc:  # a trial's failure is its row in the table, not the sweep's end
            run.error = f"{type(exc).__name__}: {exc}"
        finally:
            run.ended = True  # before the wake: a thread is alive for a moment after this
            self.wake.set()  # its slot is free

    def _judge(self) -> None:
        progress = [t.progress() for t in self.trials]
        for name, rung in judge(self.rule, progress).items():
            run = self.runs[name]
            if not run.stopping:
                run.stop(STOP_ASHA.format(rung=rung))
        for trial, seen in zip(self.trials, progress):
            trial.rung = seen.passed

    def _stop_all(self, reason: str) -> None:
        for run in self.runs.values():
            run.stop(reason)

    def _drain(self) -> None:
        for run in self.runs.values():
            if run.thread is not None:
                run.thread.join()
            self._finish(run)
        self.runs.clear()

    def _finish(self, run: TrialRun) -> None:
        run.read()
        trial, summary = run.trial, run.summary
        if summary is None:
            trial.state, trial.stop_reason = "Failed", run.error or "ended without a summary"
        else:
            trial.stop_reason = summary["stop_reason"]
            trial.cost_usd = summary["cost_usd"]
            trial.step = summary["steps"]
            trial.model_uri = summary["model_path"]
            trial.observe_loss(summary["validation_loss"])
            trial.state = "Failed" if failed(summary) else "Stopped" if run.stopped_by_sweep(summary) else "Succeeded"
            trial.killed_at = trial.step if trial.state == "Stopped" else None
        self.say(f"trial {trial.name} {trial.state.lower()} ({trial.stop_reason}), best validation "
                 f"{'-' if trial.best_validation_loss is None else f'{trial.best_validation_loss:.4f}'}, "
                 f"${trial.cost_usd:.5f}")

    def _copy_best(self, best: Trial) -> str:
        """The best trial's model and record in the sweep directory's best/ and at spec.output.uri; the model's URI."""
        record = RunRecord(self.out / TRIALS_DIR / best.name)
        uri = record.export(str(self.out / BEST_DIR))
        if self.sweep.output_uri:
            uri = record.export(self.sweep.output_uri)
        return uri
