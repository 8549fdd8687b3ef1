"""What the job has done and cost: step totals, the per-step rows, the metrics, the progress line and the summary."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mlless.contract import BARRIER_PHASES, STEP_PHASES
from mlless.progress import Progress
from mlless.protocol.messages import Report
from mlless.runtime.supervisor.evaluation import FinalModel
from mlless.runtime.supervisor.failover import JobState
from mlless.runtime.supervisor.membership import UNBILLED, Membership
from mlless.spec import TrainingJob
from mlless.telemetry.cost import CostBreakdown, job_cost, perf_per_dollar
from mlless.training.warm_start import started_from
from mlless.telemetry.metrics import SupervisorMetrics
from mlless.telemetry.record import NATIVE_FILES, RunRecord
from mlless.telemetry.rows import StepRow


@dataclass
class StepTotals:
    """Per-step sums over the reports of the live workers; phases are means over them."""

    workers: int = 0
    loss_sum: float = 0.0
    samples: int = 0
    bytes_sent: int = 0
    bytes_read: int = 0  # at the previous step's close, like the barrier phases
    entries_sent: int = 0
    entries_pending: int = 0
    staleness: int = 0  # the most any worker's replica lagged the step's closes (`Report.staleness`)
    compute_seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STEP_PHASES, 0.0))

    @classmethod
    def of(cls, reports: list[Report]) -> StepTotals:
        totals = cls(workers=len(reports))
        for r in reports:
            totals.loss_sum += r.loss_sum
            totals.samples += r.samples
            totals.bytes_sent += r.bytes_sent
            totals.bytes_read += r.bytes_read
            totals.entries_sent += r.entries_sent
            totals.entries_pending += r.entries_pending
            totals.staleness = max(totals.staleness, r.staleness)
            totals.compute_seconds += r.timings[STEP_PHASES.index("compute")]
            for phase, seconds in zip(STEP_PHASES, r.timings):
                totals.phases[phase] += seconds / len(reports)
        return totals


class Accounting:
    """The job's running totals, fed at each step close, and everything that reports them."""

    def __init__(
        self, job: TrainingJob, job_id: str, started: float, record: RunRecord, metrics: SupervisorMetrics, progress: Progress,
        redis_instances: int = 1,
    ) -> None:
        self.job = job
        self.redis_instances = redis_instances  # Redis VMs billed: the job's shards
        self.job_id = job_id
        self.started = started
        self.record = record
        self.metrics = metrics
        self.progress = progress
        self.bytes_sent = 0
        self.samples = 0
        self.compute_seconds = 0.0
        self.rejected_frames = 0
        self.repaired_frames = 0  # update frames the store lost, published again by their senders and read
        self.train_loss = math.nan
        self.max_staleness = 0  # over this supervisor's steps
        self._row: StepRow | None = None  # the previous step's row, waiting for its barrier timings
        # What the job's earlier runs took, when this supervisor took over from another (failover.py).
        self.wall_before = 0.0
        self.worker_seconds_before: list[float] = []

    def resume(self, state: JobState) -> None:
        """Continue the totals of the runs before this one."""
        self.wall_before, self.worker_seconds_before = state.wall_seconds, list(state.worker_seconds)
        self.samples, self.bytes_sent = state.samples, state.bytes_sent
        self.compute_seconds, self.rejected_frames = state.compute_seconds, state.rejected_frames
        self.repaired_frames = state.repaired_frames
        self.train_loss = math.nan if state.train_loss is None else state.train_loss

    def totals(self, now: float, members: Membership) -> dict[str, Any]:
        """The totals as a `JobState` holds them, up to `now` (monotonic)."""
        return {
            "wall_seconds": self.elapsed(now),
            "worker_seconds": self.worker_seconds_before + members.invocation_seconds(now),
            "samples": self.samples,
            "bytes_sent": self.bytes_sent,
            "compute_seconds": self.compute_seconds,
            "rejected_frames": self.rejected_frames,
            "repaired_frames": self.repaired_frames,
            "train_loss": None if math.isnan(self.train_loss) else self.train_loss,
        }

    def elapsed(self, now: float) -> float:
        """Seconds the job has run up to `now` (monotonic), in every run."""
        return self.wall_before + now - self.started

    def add(self, totals: StepTotals, train_loss: float) -> None:
        self.bytes_sent += totals.bytes_sent
        self.samples += totals.samples
        self.compute_seconds += totals.compute_seconds
        self.max_staleness = max(self.max_staleness, totals.staleness)
        self.train_loss = train_loss

    def count_rejected(self, n: int) -> None:
        self.rejected_frames += n
        self.metrics.rejected_frames(n)

    def cost(self, now: float, members: Membership) -> CostBreakdown:
        """The job's cost up to `now` (monotonic): one instant for the stop rule and the row of a step alike."""
        return job_cost(self.job.pricing, self.worker_seconds_before + members.invocation_seconds(now), self.elapsed(now),
                        self.redis_instances)

    def pod(self, rank: int) -> str:
        """The pod (or local process) a worker runs in, for the billing metrics' `pod` label."""
        return f"{self.job_id}-worker-{rank}"

    def step_closed(
        self, step: int, totals: StepTotals, now: float, epoch: float, evaluated: tuple[int, float] | None,
        members: Membership,
    ) -> float:
        """Metrics, the step's row and the progress line; returns the job's cost so far. `evaluated`: the step of
        the newest evaluated snapshot and its validation loss (None: none yet)."""
        # A report carries the barrier timings (wait/read/apply) of the step before it.
        if self._row is not None:
            for phase in BARRIER_PHASES:
                self._row.phases[phase] = totals.phases[phase]
            self._row.bytes_read = totals.bytes_read
            self.record.step(self._row)
        elapsed = self.elapsed(now)
        validation_step, validation = evaluated or (None, None)
        breakdown = self.cost(now, members)
        cost = breakdown.total
        self.metrics.step_closed(
            step=step,
            train_loss=self.train_loss,
            workers=totals.workers,
            bytes_published=totals.bytes_sent,
            entries_filtered=totals.entries_pending,
            staleness=totals.staleness,
            phases=totals.phases,
        )
        self.metrics.cost(breakdown.as_dict())
        for rank, w in members.workers.items():
            if w.state not in UNBILLED:
                self.metrics.worker_billed(rank, self.pod(rank), w.invocation_seconds(now))
        self._row = StepRow(
            step=step,
            time=round(elapsed, 6),
            epoch=epoch,
            loss=self.train_loss,
            validation_loss=validation,
            validation_step=validation_step,
            workers=totals.workers,
            samples=totals.samples,
            bytes_sent=totals.bytes_sent,
            bytes_filtered=8 * totals.entries_pending,
            entries_sent=totals.entries_sent,
            entries_pending=totals.entries_pending,
            cost_usd=cost,
            phases={p: (totals.phases[p] if p not in BARRIER_PHASES else None) for p in STEP_PHASES},
            staleness=totals.staleness,
        )
        self.progress.status(
            step=step,
            epoch=epoch,
            train_loss=self.train_loss,
            validation_loss=validation,
            workers=totals.workers,
            bytes_per_step=totals.bytes_sent,
            elapsed=elapsed,
            cost=cost,
        )
        return cost

    def flush(self) -> None:
        """Write the last step's row; its barrier timings never arrived."""
        if self._row is not None:
            self.record.step(self._row)
            self._row = None

    def summary(
        self,
        *,
        stop_reason: str | None,
        loss_metric: str,
        final: FinalModel,
        steps: int,
        epochs: float,
        now: float,
        startup: float,
        members: Membership,
        workers_final: int,
        autoscaler: dict[str, Any],
        scaling_events: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """What summary.json holds; `workers_final` counts the workers that finished the job with it."""
        wall = self.elapsed(now)  # every run's, when supervisors took over from each other
        cost = self.cost(now, members)
        best = final.best
        return {
            "job": self.job.name,
            "job_id": self.job_id,
            "model": self.job.model.type,
            "protocol": self.job.sync.protocol,
            "started_from": started_from(self.job),
            "stop_reason": stop_reason,
            "loss_metric": loss_metric,
            "train_loss": None if math.isnan(self.train_loss) else self.train_loss,
            "validation_loss": final.validation_loss,
            "model_step": final.model_step,
            "final_validation_loss": final.final_loss,
            "validation_scores": final.scores,
            "best_validation": None if best is None else {"step": best.step, "loss": best.loss},
            "steps": steps,
            "epochs": epochs,
            "wall_seconds": wall,
            "startup_seconds": startup,
            "samples": self.samples,
            "samples_per_second": self.samples / self.compute_seconds if self.compute_seconds > 0 else None,
            "bytes_sent": self.bytes_sent,
            "workers_initial": self.job.workers,
            "workers_final": workers_final,
            "dropped_workers": members.dropped,
            "replica_spread": final.spread,
            "rejected_frames": self.rejected_frames,
            "repaired_frames": self.repaired_frames,
            "max_staleness": self.max_staleness,
            "cost_usd": cost.total,
            "cost_breakdown_usd": cost.as_dict(),
            "perf_per_dollar": perf_per_dollar(wall, cost.total),
            "perf_per_dollar_workers": perf_per_dollar(wall, cost.workers),
            "vm_cost_usd": wall * self.job.pricing.vm_per_hour / 3600.0 if self.job.pricing.vm_per_hour is not None else None,
            "autoscaler": autoscaler,
            "scaling_events": scaling_events,
            "model_path": str(final.model_path) if final.model_path else None,
            NATIVE_FILES: list(final.native_files),
        }
