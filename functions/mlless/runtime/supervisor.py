"""The supervisor: closes steps, watches liveness, decides when to stop, assembles the model.

It receives every worker's per-step report (which also announces whether an
update was published), closes step t once every live worker has reported
it, and broadcasts the close with the list of updates to fetch and the
mini-batch cursor for the next step. A worker whose process ends or that
stalls past the timeout is dropped from the barrier, so the job goes on
without it. When a stop condition holds, the closing message is marked
final; the workers publish their replicas, which are averaged, evaluated on
the validation split and saved.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mlless.contract import BARRIER_PHASES, ENV_AUDIT, STEP_PHASES
from mlless.protocol.codec import FrameError, decode, encode
from mlless.protocol.messages import (
    CLOSE_FINAL, CLOSE_SNAPSHOT, Close, Done, Failed, Finish, Hello, Left, Report, Tensors,
)
from mlless.autotuner import AutoTuner
from mlless.autotuner.smoothing import OnlineEwma
from mlless.telemetry.cost import CostBreakdown, job_cost
from mlless.data.batches import Batch
from mlless.data.dataset import Dataset
from mlless.telemetry.metrics import SupervisorMetrics
from mlless.training.models import build_model
from mlless.protocol import keys
from mlless.runtime.audit import audit_conservation
from mlless.runtime.launcher import Launcher
from mlless.telemetry.record import Progress, RunRecord
from mlless.runtime.platform import Platform
from mlless.runtime.scaling import ReplicaQuality
from mlless.runtime.stopping import ValidationWatch
from mlless.spec import TrainingJob
from mlless.transport import Transport

log = logging.getLogger(__name__)

#: How long workers may take to connect, and to publish their final replicas.
STARTUP_TIMEOUT = 120.0
FINISH_TIMEOUT = 30.0
#: How long a suspended job's checkpoint outlives its other keys (which have the transport's TTL, a day).
SUSPEND_CHECKPOINT_TTL = 30 * 24 * 3600
#: Evaluations during training read at most this many validation rows (the final ones read them all): on 10M
#: ratings the whole split is 1M rows, and evaluating it every few steps cost more than training.
EVALUATION_ROWS = 100_000
#: Evaluations may take at most this share of the job's time: evaluation.everySteps is stretched when a
#: snapshot and its evaluation take longer than that (a large model with fast steps).
EVALUATION_SHARE = 0.1


#: The stop reason of a job whose every worker was dropped: it failed, even if a best snapshot was saved.
NO_LIVE_WORKERS = "no live workers"


class JobFailed(RuntimeError):
    """The job cannot continue (no live workers left, or nobody started)."""


@dataclass
class WorkerRecord:
    rank: int
    started: float
    # starting -> live -> done | dropped | leaving -> left; scale-out: joining -> ready -> live
    state: str = "starting"
    seconds: float | None = None  # invocation length once it has ended

    def ended(self, now: float) -> None:
        if self.seconds is None:
            self.seconds = now - self.started

    def invocation_seconds(self, now: float) -> float:
        return self.seconds if self.seconds is not None else now - self.started


@dataclass
class _StepTotals:
    """Per-step sums over the reports of the live workers."""

    workers: int = 0
    loss_sum: float = 0.0
    samples: int = 0
    bytes_sent: int = 0
    entries_sent: int = 0
    entries_pending: int = 0
    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STEP_PHASES, 0.0))


class Supervisor:
    def __init__(
        self,
        job: TrainingJob,
        job_id: str,
        transport: Transport,
        launcher: Launcher,
        run_dir: Path,
        progress: Progress | None = None,
        platform: Platform | None = None,
        metrics: SupervisorMetrics | None = None,
    ) -> None:
        self.job = job
        self.job_id = job_id
        self.transport = transport
        self.launcher = launcher
        self.dataset = Dataset.open(job.dataset_uri)
        # One model instance for the supervisor's evaluations; replicas are copied into it.
        self.model = build_model(job.model.type, self.dataset.dims(), job.model, job.seed)
        self.validation_batch = self.dataset.validation()
        self.evaluation_batch = self.validation_batch.head(EVALUATION_ROWS)
        # With MLLESS_AUDIT set, workers track their contribution and the end of the job checks conservation.
        self.x0 = self.model.params.copy() if os.environ.get(ENV_AUDIT) else None
        self.record = RunRecord(run_dir)
        self.progress = progress or Progress(enabled=False)
        self.workers: dict[int, WorkerRecord] = {}
        self.reports: dict[int, dict[int, Report]] = {}
        self.closed = 0
        self.cursor = 0
        self.steps_before = 0  # steps closed before a suspend this run resumed from
        self.started = time.monotonic()
        self.step_opened = self.started
        self.training_started = self.started  # when step 0 was closed: the workers had started and connected
        self.closed_at = self.started  # when the newest step was closed
        self.below_target = 0  # steps the training loss has stayed at or below the target (evaluation off)
        # With evaluation on, the target and patience read the smoothed validation loss, and the best snapshot is kept.
        self.watch = ValidationWatch(job.stop.patience if job.evaluate_every else None,
                                     job.stop.target_loss if job.evaluate_every else None, job.stop.target_steps)
        self.final_average: np.ndarray | None = None  # the average of the final replicas, which a suspended job resumes from
        self.train_loss = math.nan
        self.validation: tuple[int, float] | None = None  # (step, loss) of the newest evaluation
        self.pending_snapshot: int | None = None
        self.snapshot_requested = 0.0  # when the pending snapshot was asked for (monotonic)
        self.last_evaluated = 0  # step of the newest snapshot asked for
        self.evaluation_seconds = OnlineEwma(span=5)  # snapshot asked for -> evaluated
        self.step_seconds = OnlineEwma(span=20)  # between step closes
        self.stop_reason: str | None = None
        self.totals = {"bytes_sent": 0, "samples": 0, "compute_seconds": 0.0}
        self.rejected_frames = 0
        self.dropped: list[dict[str, Any]] = []
        self.platform = platform or Platform()
        self.metrics = metrics or SupervisorMetrics.for_job(job_id, job.pricing)
        self.tuner = AutoTuner(job.autoscaler) if job.autoscaler.enabled else None
        self.quality = ReplicaQuality()
        self.desired = job.workers
        # Requests from other threads (the operator, tests), applied at the next step close.
        self._requested: int | None = None
        self._stop_requested: str | None = None
        self.pending_merges: list[int] = []
        self.removing: set[int] = set()  # ranks the auto-tuner took out, reported to the platform once they are gone
        self.suspend_checkpoint: bytes | None = None
        self._interrupted = False  # set by SIGINT/SIGTERM, acted on between messages
        self.scaling_events: list[dict[str, Any]] = []
        self.decisions: dict[str, int] = {}
        self._row: dict[str, Any] | None = None  # the previous step's row, waiting for its barrier timings

    # ---- lifecycle ---------------------------------------------------------------------------

    @property
    def live(self) -> tuple[int, ...]:
        return tuple(sorted(r for r, w in self.workers.items() if w.state == "live"))

    def run(self) -> dict[str, Any]:
        """Train to a stop condition; returns the summary written to summary.json.

        Ctrl-C, or SIGTERM when this runs in the main thread (a deleted supervisor pod), ends the job
        cleanly: the workers publish their replicas, the model is saved, and keys and queues are deleted.
        A second one stops waiting for the workers.
        """
        previous = self._catch_signals()
        try:
            self._resume_from_checkpoint()
            self._start_workers()
            while self.stop_reason is None:
                self._raise_if_interrupted()
                body = self.transport.receive(timeout=0.2)
                if body is not None:
                    self._handle(body)
                self._check_liveness()
            return self._finish()
        except KeyboardInterrupt:
            self.stop_reason = "interrupted"
            self.transport.broadcast(encode(Finish(sender=-1, step=self.closed)))
            return self._finish()
        finally:
            self.launcher.stop_all()
            deleted = self.transport.delete_job()
            log.info("job %s: deleted %d keys", self.job_id, deleted)
            if self.suspend_checkpoint is not None:
                # Everything else of the job is gone; the model it resumes from stays, for as long as a job
                # may reasonably stay suspended (deleting the job deletes it, on a managed or external Redis).
                self.transport.put(keys.job_checkpoint(), self.suspend_checkpoint, ttl=SUSPEND_CHECKPOINT_TTL)
            self.record.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _catch_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {signum: signal.signal(signum, self._on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}

    def _on_signal(self, signum: int, frame: object) -> None:
        # Raising right here could cut a Redis or RabbitMQ exchange in half; the loops check the flag
        # between messages instead. Only a second signal before that raises at once.
        if self._interrupted:
            raise KeyboardInterrupt
        self._interrupted = True

    def _raise_if_interrupted(self) -> None:
        if self._interrupted:
            self._interrupted = False  # taken in: from now on another signal stops the clean shutdown
            raise KeyboardInterrupt

    def _resume_from_checkpoint(self) -> None:
        """A suspended job resumes from its averaged model: the workers load it, the batch cursor continues."""
        frame = self.transport.get_many([keys.job_checkpoint()])[0]
        if frame is None:
            return
        tensors = self._decode_replica(frame)
        position = tensors.arrays.get("position") if tensors is not None else None
        if position is None or position.shape != (2,):
            log.error("job %s: ignoring a malformed suspend checkpoint", self.job_id)
            return
        self.steps_before, self.cursor = (int(v) for v in position)
        self.progress.message(f"job {self.job_id}: resuming from the checkpoint of step {self.steps_before}")

    def _start_workers(self) -> None:
        for rank in range(self.job.workers):
            self.workers[rank] = WorkerRecord(rank, time.monotonic())
            self.launcher.start(rank)
        self._await_workers(set(self.workers), "starting", STARTUP_TIMEOUT, "exited before it connected")
        for rank, w in self.workers.items():
            if w.state == "starting":
                self._drop(rank, "did not connect in time")
        if not self.live:
            raise JobFailed("no worker started; see the worker logs")
        self.progress.message(f"job {self.job_id}: {len(self.live)} workers, {self.job.sync.protocol.upper()}")
        self.step_opened = self.training_started = time.monotonic()
        self.transport.broadcast(encode(Close(sender=-1, step=0, cursor=0, flags=0, live=self.live, updates=())))

    def _await_workers(self, ranks: set[int], state: str, timeout: float, exit_reason: str) -> None:
        """Handle messages until none of `ranks` is still in `state`; a process that ends meanwhile is dropped."""
        deadline = time.monotonic() + timeout
        while any(self.workers[r].state == state for r in ranks) and time.monotonic() < deadline:
            self._raise_if_interrupted()
            body = self.transport.receive(timeout=0.2)
            if body is not None:
                self._handle(body)
            for rank in self.launcher.exited():
                if self.workers[rank].state == state:
                    self._drop(rank, exit_reason)

    # ---- messages ----------------------------------------------------------------------------

    def _handle(self, body: bytes) -> None:
        try:
            msg = decode(body)
        except FrameError as exc:
            self._count_rejected(1)
            log.error("supervisor: rejected frame: %s", exc)
            return
        worker = self.workers.get(msg.sender)
        if worker is None and isinstance(msg, Hello) and not self.launcher.starts_workers and msg.sender >= 0:
            # The operator started a new rank (kubectl scale); it joins like a scale-out worker.
            worker = self.workers[msg.sender] = WorkerRecord(msg.sender, time.monotonic(), state="joining")
            self.desired = max(self.desired, sum(w.state in ("live", "joining", "ready") for w in self.workers.values()))
        if worker is None:
            self._count_rejected(1)
            log.error("supervisor: message from unknown worker %d", msg.sender)
            return
        if isinstance(msg, Hello):
            worker.state = {"starting": "live", "joining": "ready"}.get(worker.state, worker.state)
        elif isinstance(msg, Report):
            if worker.state == "live" and msg.step > self.closed:
                self.reports.setdefault(msg.step, {})[msg.sender] = msg
                self.quality.observe(msg.sender, msg.loss_sum, msg.samples)
                self._close_ready_steps()
        elif isinstance(msg, Done):
            worker.state = "done"
            # Billing runs from invocation to return as the platform sees it, cold start included,
            # so the supervisor's clock counts, not the worker's own msg.seconds.
            worker.ended(time.monotonic())
            self._count_rejected(msg.rejected_frames)
        elif isinstance(msg, Left):
            self._left(worker, msg)
        elif isinstance(msg, Failed):
            self._drop(msg.sender, f"failed: {msg.reason}")

    def _close_ready_steps(self) -> None:
        while self.stop_reason is None:
            step = self.closed + 1
            reports = self.reports.get(step, {})
            if not self.live or not set(self.live) <= set(reports):
                return
            self._close(step, [reports[r] for r in self.live])

    def _close(self, step: int, reports: list[Report]) -> None:
        totals = _StepTotals(workers=len(reports))
        for r in reports:
            totals.loss_sum += r.loss_sum
            totals.samples += r.samples
            totals.bytes_sent += r.bytes_sent
            totals.entries_sent += r.entries_sent
            totals.entries_pending += r.entries_pending
            for phase, seconds in zip(STEP_PHASES, r.timings):
                totals.phases[phase] += seconds / len(reports)
        self.totals["bytes_sent"] += totals.bytes_sent
        self.totals["samples"] += totals.samples
        self.totals["compute_seconds"] += sum(r.timings[1] for r in reports)
        self.train_loss = self.model.loss(totals.loss_sum, totals.samples) if totals.samples else math.nan

        self.closed = step
        self.cursor += len(reports)
        del self.reports[step]
        self.step_seconds.update(time.monotonic() - self.closed_at)
        self.closed_at = time.monotonic()
        self._check_stop()
        joined = False
        if self.stop_reason is None:
            self._autoscale(step, len(reports))
            joined = self._admit_joiners()
        flags = 0
        if self.stop_reason is not None:
            flags |= CLOSE_FINAL
        elif joined or self._evaluation_due(step):
            # A joiner starts from this snapshot; the supervisor evaluates it too.
            flags |= CLOSE_SNAPSHOT
            self.pending_snapshot = self.last_evaluated = step
            self.snapshot_requested = time.monotonic()
        updates = tuple(r.sender for r in reports if r.has_update)
        merges, self.pending_merges = tuple(self.pending_merges), []
        close = Close(sender=-1, step=step, cursor=self.cursor, flags=flags, live=self.live, updates=updates, merges=merges)
        self.transport.broadcast(encode(close))
        self.step_opened = time.monotonic()
        self._evaluate_snapshot()
        self._sync_platform(self._record_step(step, totals))

    def _record_step(self, step: int, totals: _StepTotals) -> float:
        """Metrics, the step's row and the progress line; returns the job's cost so far."""
        # A report carries the barrier timings (wait/read/apply) of the step before it.
        if self._row is not None:
            for phase in BARRIER_PHASES:
                self._row["phases"][phase] = totals.phases[phase]
            self.record.step(self._row)
        now = self.closed_at
        elapsed = now - self.started
        validation = self.validation[1] if self.validation else None
        breakdown = self._cost(now)
        cost = breakdown.total
        self.metrics.step_closed(
            step=step,
            train_loss=self.train_loss,
            workers=totals.workers,
            bytes_published=totals.bytes_sent,
            entries_filtered=totals.entries_pending,
            phases=totals.phases,
        )
        self.metrics.cost(breakdown.as_dict())
        for rank, w in self.workers.items():
            if w.state not in ("joining", "ready", "starting"):
                self.metrics.worker_billed(rank, self._pod(rank), w.invocation_seconds(now))
        self._row = {
            "step": step,
            "time": round(elapsed, 6),
            "epoch": self.cursor / self.dataset.n_batches,
            "loss": self.train_loss,
            "validation_loss": validation,
            "workers": totals.workers,
            "samples": totals.samples,
            "bytes_sent": totals.bytes_sent,
            "bytes_filtered": 8 * totals.entries_pending,
            "entries_sent": totals.entries_sent,
            "entries_pending": totals.entries_pending,
            "cost_usd": cost,
            "phases": {p: (totals.phases[p] if p not in BARRIER_PHASES else None) for p in STEP_PHASES},
        }
        self.progress.update(
            step=step,
            epoch=self._row["epoch"],
            train_loss=self.train_loss,
            validation_loss=validation,
            workers=totals.workers,
            bytes_per_step=totals.bytes_sent,
            elapsed=elapsed,
            cost=cost,
        )
        return cost

    # ---- stop rules, liveness, evaluation ------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """End the job at the next step close, as if a stop rule had fired (thread-safe)."""
        self._stop_requested = reason

    def _check_stop(self) -> None:
        stop = self.job.stop
        elapsed = self.closed_at - self.started
        if stop.target_loss is not None and not self.job.evaluate_every:
            self.below_target = self.below_target + 1 if self.train_loss <= stop.target_loss else 0
        if self._stop_requested is not None:
            self.stop_reason = self._stop_requested
        elif self.watch.target_held(self.steps_before + self.closed) or (
                stop.target_loss is not None and self.below_target >= stop.target_steps):
            self.stop_reason = "target loss reached"
        elif self.watch.patience_exhausted():
            self.stop_reason = "validation loss stopped improving"
        elif stop.max_steps is not None and self.steps_before + self.closed >= stop.max_steps:
            self.stop_reason = "max steps"
        elif stop.max_epochs is not None and self.cursor >= stop.max_epochs * self.dataset.n_batches:
            self.stop_reason = "max epochs"
        elif stop.max_seconds is not None and elapsed >= stop.max_seconds:
            self.stop_reason = "max seconds"
        elif stop.budget_usd is not None and self._cost(self.closed_at).total >= stop.budget_usd:
            self.stop_reason = "budget reached"

    # ---- scaling: the auto-tuner, scale requests, evictions and joins ----------------------------

    def request_workers(self, n: int) -> None:
        """Ask for `n` workers (thread-safe); applied at the next step close. Scale-out goes beyond the papers."""
        self._requested = max(1, n)

    def _autoscale(self, step: int, trained: int) -> None:
        if self.tuner is not None:
            decision = self.tuner.observe(step, self.train_loss, time.monotonic(), trained)
            if decision is not None:
                self.decisions[decision.outcome] = self.decisions.get(decision.outcome, 0) + 1
                self.metrics.tuner_decision(decision.outcome)
                if self.tuner.knee_step is not None:
                    self.metrics.knee(self.tuner.knee_step)
                log.info("auto-tuner at step %d: %s (%s)", step, decision.outcome, decision.reason)
                if decision.outcome == "remove" and self.desired > self.job.autoscaler.min_workers:
                    self.desired -= 1
                    victim = self.quality.worst(self.live)
                    self._evict(victim, f"auto-tuner: {decision.reason}")
                    self.removing.add(victim)
        if self._requested is not None:
            self.desired, self._requested = self._requested, None
        # On Kubernetes the platform removes workers itself on a scale request (their workers leave on SIGTERM).
        while len(self.live) > self.desired and not self.launcher.platform_scales_in:
            self._evict(self.quality.worst(self.live), f"scaled to {self.desired} workers")
        while self.launcher.starts_workers and self._active() < self.desired:
            self._launch_joiner()

    def _active(self) -> int:
        return sum(w.state in ("live", "joining", "ready") for w in self.workers.values())

    def _gone(self, worker: WorkerRecord) -> None:
        """`worker`'s invocation has ended; a rank the tuner removed is now reported, so the platform drops that one."""
        worker.state = "left"
        worker.ended(time.monotonic())
        if worker.rank in self.removing:
            self.removing.discard(worker.rank)
            self.platform.set_workers(self.desired, removed=worker.rank)

    def _sync_platform(self, cost_usd: float) -> None:
        """Mirror progress to the platform and take in what its users asked for (kubectl scale, suspend)."""
        self.platform.publish(self._status_fields(cost_usd))
        request = self.platform.poll()
        if request is None:
            return
        if request.suspend and self._stop_requested is None:
            self.request_stop("suspended")
        if request.workers is not None and request.workers != self.desired:
            self.progress.message(f"step {self.closed}: {request.workers} workers requested")
            self.request_workers(request.workers)

    def _status_fields(self, cost_usd: float) -> dict[str, Any]:
        """What the platform shows of the job; `cost_usd` as the step's row or the summary has it."""
        validation = self.validation[1] if self.validation else None
        return {
            "step": self.steps_before + self.closed,
            "trainLoss": None if math.isnan(self.train_loss) else self.train_loss,
            "validationLoss": validation,
            "costUSD": round(cost_usd, 6),
            "workers": len(self.live),
        }

    def _evict(self, rank: int, reason: str) -> None:
        """Take `rank` out of the next step; seeing itself missing from the close, it hands on its updates and ends."""
        self.workers[rank].state = "leaving"
        self.scaling_events.append({"event": "leave", "rank": rank, "step": self.closed, "reason": reason})
        self.progress.message(f"step {self.closed}: worker {rank} leaves ({reason})")

    def _left(self, worker: WorkerRecord, msg: Left) -> None:
        if worker.state not in ("live", "leaving"):
            return
        if worker.state == "live":  # it left on its own: SIGTERM, e.g. its pod was deleted
            self.scaling_events.append({"event": "leave", "rank": worker.rank, "step": self.closed, "reason": "left on its own"})
            # The platform removed it, on its own or on a scale request the supervisor may already have taken in.
            self.desired = max(1, min(self.desired, self._active() - 1))
        self._gone(worker)
        if msg.has_replica:
            self.pending_merges.append(worker.rank)
        if self._active() == 0:
            # Every worker pod was deleted: nobody is left to train, but the leavers' replicas still make the model.
            self.stop_reason = self.stop_reason or NO_LIVE_WORKERS
        self._close_ready_steps()

    def _launch_joiner(self) -> None:
        rank = max(self.workers) + 1
        self.workers[rank] = WorkerRecord(rank, time.monotonic(), state="joining")
        self.launcher.start(rank)
        self.scaling_events.append({"event": "launch", "rank": rank, "step": self.closed, "reason": f"scaled to {self.desired}"})

    def _admit_joiners(self) -> bool:
        ready = [w for w in self.workers.values() if w.state == "ready"]
        for w in ready:
            w.state = "live"
            self.scaling_events.append({"event": "join", "rank": w.rank, "step": self.closed + 1, "reason": "snapshot"})
            self.progress.message(f"step {self.closed}: worker {w.rank} joins")
        return bool(ready)

    def _check_liveness(self) -> None:
        for rank in self.launcher.exited():
            if self.workers[rank].state in ("live", "joining", "ready"):
                self._drop(rank, "its process ended")
            elif self.workers[rank].state == "leaving":
                self._gone(self.workers[rank])  # it ended without handing on its updates
        if time.monotonic() - self.step_opened > self.job.worker_timeout_seconds:
            reported = self.reports.get(self.closed + 1, {})
            for rank in self.live:
                if rank not in reported:
                    self._drop(rank, f"no report for step {self.closed + 1} in {self.job.worker_timeout_seconds:g}s")
            self.step_opened = time.monotonic()
        if self.stop_reason is None:
            self._close_ready_steps()

    def _drop(self, rank: int, why: str) -> None:
        worker = self.workers[rank]
        if worker.state in ("dropped", "done", "left"):
            return
        worker.state = "dropped"
        worker.ended(time.monotonic())
        self.dropped.append({"rank": rank, "step": self.closed, "reason": why})
        self.progress.message(f"worker {rank} dropped at step {self.closed}: {why}")
        log.warning("worker %d dropped at step %d: %s", rank, self.closed, why)
        self.launcher.stop(rank)
        if not self.live and all(w.state != "starting" for w in self.workers.values()):
            self.stop_reason = self.stop_reason or NO_LIVE_WORKERS

    def _evaluation_due(self, step: int) -> bool:
        """Every evaluation.everySteps steps, or less often if evaluating would take over EVALUATION_SHARE of the time.

        A snapshot that never arrived (its donor left) is simply replaced by the next one.
        """
        if not self.job.evaluate_every:
            return False
        interval = self.job.evaluate_every
        if self.evaluation_seconds.value and self.step_seconds.value:
            interval = max(interval, math.ceil(self.evaluation_seconds.value / EVALUATION_SHARE / self.step_seconds.value))
        return step - self.last_evaluated >= interval

    def _evaluate_snapshot(self) -> None:
        if self.pending_snapshot is None:
            return
        frame = self.transport.get_many([keys.snapshot()])[0]
        if frame is None:
            return
        tensors = self._decode_replica(frame)
        if tensors is None or tensors.step != self.pending_snapshot:
            return
        self.validation = (tensors.step, self._evaluate(tensors.arrays["params"], self.evaluation_batch))
        self.watch.observe(self.steps_before + tensors.step, self.validation[1], tensors.arrays["params"])
        self.evaluation_seconds.update(time.monotonic() - self.snapshot_requested)
        self.metrics.validation(self.validation[1])
        self.pending_snapshot = None

    def _decode_replica(self, frame: bytes) -> Tensors | None:
        try:
            msg = decode(frame)
            if not isinstance(msg, Tensors) or "params" not in msg.arrays:
                raise FrameError("expected a replica (Tensors frame with 'params')")
            params = msg.arrays["params"]
            if params.shape != self.model.params.shape or params.dtype != self.model.params.dtype:
                raise FrameError(f"replica is {params.dtype}{params.shape}, the model is {self.model.params.dtype}{self.model.params.shape}")
        except FrameError as exc:
            self._count_rejected(1)
            log.error("supervisor: rejected replica: %s", exc)
            return None
        return msg

    def _evaluate(self, params: np.ndarray, batch: Batch) -> float:
        """Loss of a replica (its shape was checked when it was decoded) on `batch`."""
        self.model.params[:] = params
        loss_sum, n = self.model.evaluate(batch)
        return self.model.loss(loss_sum, n)

    def _count_rejected(self, n: int) -> None:
        self.rejected_frames += n
        self.metrics.rejected_frames(n)

    def _pod(self, rank: int) -> str:
        """The pod (or local process) a worker runs in, for the billing metrics' `pod` label."""
        return f"{self.job_id}-worker-{rank}"

    def _cost(self, now: float) -> CostBreakdown:
        """The job's cost up to `now` (monotonic): one instant for the stop rule and the row of a step alike."""
        return job_cost(self.job.pricing, [w.invocation_seconds(now) for w in self.workers.values()], now - self.started)

    # ---- end of job ------------------------------------------------------------------------------

    def _finish(self) -> dict[str, Any]:
        finishing = set(self.live)
        self._await_workers(finishing, "live", FINISH_TIMEOUT, "its process ended before publishing its replica")
        wall = time.monotonic() - self.started
        finals = self._collect_replicas(keys.final_replica, [r for r in finishing if self.workers[r].state == "done"])
        # Workers that left after the last close (stopped together with the supervisor: a deleted job,
        # activeDeadlineSeconds) never had their replicas merged into anyone's; they are as final as the rest.
        left_at_end = sorted(set(self.pending_merges))
        finals += self._collect_replicas(keys.leaver_replica, left_at_end)
        if self._row is not None:
            self.record.step(self._row)
            self._row = None
        summary = self._summary(wall, [t.arrays["params"] for t in finals])
        if self.x0 is not None:
            leavers = self._collect_replicas(keys.leaver_replica, [r for r, w in self.workers.items() if w.state == "left" and r not in left_at_end])
            summary["audit"] = audit_conservation(self.x0, finals, leavers) if not self.dropped else {
                "checked": False,
                "reason": "a dropped worker took its unsent updates with it",
            }
        self.record.summary(summary)
        final = self._status_fields(summary["cost_usd"]) | {"modelURI": self._export(summary["model_path"])}
        # The suspend checkpoint is the average of the final replicas; a best snapshot alone (no replica survived) is not one.
        if self.stop_reason == "suspended" and self.final_average is not None:
            self.suspend_checkpoint = self._checkpoint_frame()
            final["checkpointStep"] = self.steps_before + self.closed
        self.platform.publish(final, final=True)
        return summary

    def _export(self, model_path: str | None) -> str | None:
        """Where the model ends up: spec.output.uri if the copy there succeeds, else the run directory."""
        if not self.job.output_uri or model_path is None:
            return model_path
        try:
            uri = self.record.export(self.job.output_uri)
        except (OSError, ValueError, ImportError) as exc:
            log.error("could not copy the results to %s: %s", self.job.output_uri, exc)
            self.progress.message(f"could not copy the results to {self.job.output_uri}: {exc}; they stay in {self.record.run_dir}")
            return model_path
        self.progress.message(f"results copied to {self.job.output_uri}")
        return uri

    def _checkpoint_frame(self) -> bytes:
        """The averaged final replicas and where the job stands."""
        assert self.final_average is not None
        position = np.array([self.steps_before + self.closed, self.cursor], np.int64)
        return encode(Tensors(sender=0, step=self.closed, arrays={
            "params": self.final_average,
            # Empty, so a worker reads it like any replica: the averaged model has no unsent updates.
            "pending_indices": np.zeros(0, np.int32),
            "pending_values": np.zeros(0, np.float32),
            "position": position,
        }))

    def _collect_replicas(self, key: Callable[[int], str], ranks: list[int]) -> list[Tensors]:
        frames = self.transport.get_many([key(r) for r in ranks]) if ranks else []
        replicas = []
        for rank, frame in zip(ranks, frames):
            tensors = self._decode_replica(frame) if frame is not None else None
            if tensors is None:
                log.error("worker %d: replica %s missing or invalid; left out", rank, key(rank))
                continue
            replicas.append(tensors)
        return replicas

    def _summary(self, wall: float, replicas: list[np.ndarray]) -> dict[str, Any]:
        validation_loss = final_loss = None
        spread = None
        model_path = None
        model_step = None
        best = self.watch.best  # the best snapshot, its loss re-read on the whole validation split
        if best is not None and len(self.evaluation_batch) < len(self.validation_batch):
            best = dataclasses.replace(best, loss=self._evaluate(best.params, self.validation_batch))
        if replicas:
            stacked = np.stack(replicas)
            self.final_average = stacked.mean(axis=0, dtype=np.float64).astype(np.float32)
            spread = float(np.max(np.abs(stacked - self.final_average))) if len(replicas) > 1 else 0.0
            validation_loss = final_loss = self._evaluate(self.final_average, self.validation_batch)
            model_step = self.steps_before + self.closed
            self.model.params[:] = self.final_average
        # Hand back the best snapshot evaluated when the model trained past it (overfitting, a noisy end), when
        # the final replicas are not finite, or when none survived (every worker diverged or was lost).
        if best is not None and not (final_loss is not None and final_loss <= best.loss):
            self.model.params[:] = best.params
            validation_loss, model_step = best.loss, best.step
        if validation_loss is not None:
            model_path = self.record.run_dir / "model.npz"
            self.model.save(model_path, {"job": self.job.name, "job_id": self.job_id, "steps": model_step})
        cost = self._cost(self.started + wall)
        compute = self.totals["compute_seconds"]
        return {
            "job": self.job.name,
            "job_id": self.job_id,
            "model": self.job.model.type,
            "protocol": self.job.sync.protocol,
            "stop_reason": self.stop_reason,
            "loss_metric": self.model.loss_metric,
            "train_loss": None if math.isnan(self.train_loss) else self.train_loss,
            "validation_loss": validation_loss,
            "model_step": model_step,
            "final_validation_loss": final_loss,
            "best_validation": None if best is None else {"step": best.step, "loss": best.loss},
            "steps": self.closed,
            "epochs": self.cursor / self.dataset.n_batches,
            "wall_seconds": wall,
            "startup_seconds": self.training_started - self.started,
            "samples": self.totals["samples"],
            "samples_per_second": self.totals["samples"] / compute if compute > 0 else None,
            "bytes_sent": self.totals["bytes_sent"],
            "workers_initial": self.job.workers,
            "workers_final": len(replicas),
            "dropped_workers": self.dropped,
            "replica_spread": spread,
            "rejected_frames": self.rejected_frames,
            "cost_usd": cost.total,
            "cost_breakdown_usd": cost.as_dict(),
            "perf_per_dollar": 1.0 / (wall * cost.total) if wall > 0 and cost.total > 0 else None,
            "vm_cost_usd": wall * self.job.pricing.vm_per_hour / 3600.0 if self.job.pricing.vm_per_hour is not None else None,
            "autoscaler": {
                "enabled": self.tuner is not None,
                "knee_step": self.tuner.knee_step if self.tuner is not None else None,
                "decisions": self.decisions,
            },
            "scaling_events": self.scaling_events,
            "model_path": str(model_path) if model_path else None,
        }

