"""The job's size: the auto-tuner, scale requests, evictions, leaves and joins.

Who leaves on scale-in: the papers remove the "lowest-quality replica"
without defining it; the original code evicted whichever worker reported
last. Here quality is each worker's recent training loss (`ReplicaQuality`):
an exponentially weighted mean of its per-step loss (loss sum / samples of
its own mini-batches). Every worker trains the same shared model plus its
own unsent updates, on batches drawn from the same shuffled stream, so over
several steps a persistently higher loss points at the replica whose local
drift hurts most.

An evicted worker sees itself missing from the next step-close, hands on its
unsent updates and ends; a joiner starts from a snapshot and enters the
barrier at the close that admits it (loop.py broadcasts both).
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable

from mlless.autotuner.tuner import AutoTuner
from mlless.progress import Progress
from mlless.protocol import keys, layouts
from mlless.protocol.messages import Tensors
from mlless.launch.platform import Platform
from mlless.runtime.supervisor.failover import JobState
from mlless.runtime.supervisor.membership import Membership, WorkerRecord, WorkerState
from mlless.spec import TrainingJob
from mlless.telemetry.metrics import SupervisorMetrics

log = logging.getLogger(__name__)


class ReplicaQuality:
    """EWMA of each worker's per-step training loss; the worst is evicted first."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.loss: dict[int, float] = {}

    def observe(self, rank: int, loss_sum: float, samples: int) -> None:
        if samples <= 0 or not math.isfinite(loss_sum):
            return
        loss = loss_sum / samples
        previous = self.loss.get(rank)
        self.loss[rank] = loss if previous is None else previous + self.alpha * (loss - previous)

    def worst(self, ranks: tuple[int, ...]) -> int:
        """The rank with the highest recent loss; ties (or no data) go to the highest rank."""
        return max(ranks, key=lambda r: (self.loss.get(r, -math.inf), r))


class Scaling:
    """How many workers the job wants, and the evictions, launches and admissions that get it there."""

    def __init__(self, job: TrainingJob, members: Membership, platform: Platform, metrics: SupervisorMetrics,
                 progress: Progress) -> None:
        self.job = job
        self.members = members
        self.launcher = members.launcher
        self.platform = platform
        self.metrics = metrics
        self.progress = progress
        self.tuner = AutoTuner(job.autoscaler) if job.autoscaler.enabled else None
        self.quality = ReplicaQuality()
        self.desired = job.workers
        # A scale request from another thread (the operator, tests), applied at the next step close.
        self._requested: int | None = None
        self.pending_merges: list[int] = []  # leavers whose replicas the next close asks the survivors to merge
        self.merged: list[tuple[int, tuple[int, ...]]] = []  # (step, leavers) of each close that asked for merges
        self.removing: set[int] = set()  # ranks the auto-tuner took out, reported to the platform once they are gone
        self.events: list[dict[str, Any]] = []
        self.decisions: dict[str, int] = {}

    def resume(self, state: JobState) -> None:
        """Continue the history of a job an earlier run left (failover.py)."""
        self.events, self.decisions = list(state.scaling_events), dict(state.decisions)

    def request(self, n: int) -> None:
        """Ask for `n` workers (thread-safe); applied at the next step close. Scale-out goes beyond the papers."""
        self._requested = max(1, n)

    def autoscale(self, step: int, trained: int, train_loss: float) -> None:
        """At the close of `step`: what the auto-tuner decides, then any scale request, evictions and launches."""
        if self.tuner is not None:
            decision = self.tuner.observe(step, train_loss, time.monotonic(), trained)
            if decision is not None:
                self.decisions[decision.outcome] = self.decisions.get(decision.outcome, 0) + 1
                self.metrics.tuner_decision(decision.outcome)
                if self.tuner.knee_step is not None:
                    self.metrics.knee(self.tuner.knee_step)
                log.info("auto-tuner at step %d: %s (%s)", step, decision.outcome, decision.reason)
                if decision.outcome == "remove" and self.desired > self.job.autoscaler.min_workers:
                    self.remove_worst(step, f"auto-tuner: {decision.reason}")
        if self._requested is not None:
            self.desired, self._requested = self._requested, None
        # On Kubernetes the platform removes workers itself on a scale request (their workers leave on SIGTERM).
        while len(self.members.live) > self.desired and not self.launcher.platform_scales_in:
            self._evict(step, self.quality.worst(self.members.live), f"scaled to {self.desired} workers")
        while self.launcher.starts_workers and self.members.active() < self.desired:
            self._launch_joiner(step)

    def remove_worst(self, step: int, reason: str) -> None:
        """Want one worker less and evict the worst; the platform hears of it once that worker is gone."""
        self.desired -= 1
        victim = self.quality.worst(self.members.live)
        self._evict(step, victim, reason)
        self.removing.add(victim)

    def _evict(self, step: int, rank: int, reason: str) -> None:
        """Take `rank` out of the next step; seeing itself missing from the close, it hands on its updates and ends."""
        self.members.workers[rank].move(WorkerState.LEAVING)
        self._event("leave", rank, step, reason)
        self.progress.message(f"step {step}: worker {rank} leaves ({reason})")

    def gone(self, worker: WorkerRecord) -> None:
        """`worker`'s invocation has ended; a rank the tuner removed is now reported, so the platform drops that one."""
        worker.move(WorkerState.LEFT)
        if worker.rank in self.removing:
            self.removing.discard(worker.rank)
            self.platform.set_workers(self.desired, removed=worker.rank)

    def left(self, worker: WorkerRecord, has_replica: bool, step: int) -> bool:
        """`worker` said it left, after `step`; False if it was not in the job (nothing changed)."""
        if worker.state not in (WorkerState.LIVE, WorkerState.LEAVING):
            return False
        if worker.state == WorkerState.LIVE:  # it left on its own: SIGTERM, e.g. its pod was deleted
            self._event("leave", worker.rank, step, "left on its own")
            # The platform removed it, on its own or on a scale request the supervisor may already have taken in.
            self.desired = max(1, min(self.desired, self.members.active() - 1))
        self.gone(worker)
        if has_replica:
            self.pending_merges.append(worker.rank)
        return True

    def take_merges(self, step: int) -> tuple[int, ...]:
        """The leavers whose replicas the close of `step` asks the survivors to merge; each goes into one close."""
        merges, self.pending_merges = tuple(self.pending_merges), []
        if merges:
            self.merged.append((step, merges))
        return merges

    def catch_up(self, finals: list[Tensors], collect: Callable[[Callable[[int], str], list[int]], list[Tensors]]) -> None:
        """Add to each final replica the leavers' unsent entries that a close asked it to merge after the newest
        close it applied, as the worker would have (`Worker._merge_leavers`): a worker that leaves on SIGTERM
        inside a round reads no close, and when every worker leaves, their replicas are the final ones."""
        for final in finals:
            missed = [rank for step, ranks in self.merged if step > final.step for rank in ranks]
            for leaver in collect(keys.leaver_replica, missed):
                indices, values = layouts.pending(leaver.arrays)
                final.arrays[layouts.PARAMS][indices] += values

    def adopt(self, rank: int) -> WorkerRecord:
        """The operator started a new rank (kubectl scale); it joins like a scale-out worker."""
        worker = self.members.add(rank, WorkerState.JOINING)
        self.desired = max(self.desired, self.members.active())
        return worker

    def _launch_joiner(self, step: int) -> None:
        rank = max(self.members.workers) + 1
        self.members.start(rank, WorkerState.JOINING)
        self._event("launch", rank, step, f"scaled to {self.desired}")

    def admit_joiners(self, step: int) -> bool:
        """Every ready joiner enters the barrier after `step`; whether any did."""
        ready = self.members.admit_ready()
        for w in ready:
            self._event("join", w.rank, step + 1, "snapshot")
            self.progress.message(f"step {step}: worker {w.rank} joins")
        return bool(ready)

    def _event(self, event: str, rank: int, step: int, reason: str) -> None:
        self.events.append({"event": event, "rank": rank, "step": step, "reason": reason})

    def summary(self) -> dict[str, Any]:
        """The auto-tuner's part of summary.json."""
        return {
            "enabled": self.tuner is not None,
            "knee_step": self.tuner.knee_step if self.tuner is not None else None,
            "decisions": self.decisions,
        }
