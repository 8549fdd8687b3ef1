"""The supervisor's loop: closes steps, watches liveness, scales, and ends the job.

It receives every worker's per-step report (which also announces whether an
update was published), closes step t once every live worker has reported
it, and broadcasts the close with the list of updates to fetch and the
mini-batch cursor for the next step. A worker whose process ends or that
stalls past the timeout is dropped from the barrier, so the job goes on
without it. When a stop condition holds, the closing message is marked
final; the workers publish their replicas, which are merged, evaluated on
the validation split and saved.

Who is in the job is `membership`, how many it wants `scaling`, when it
stops `stopping`, what it did and cost `accounting`, what its replicas are
worth `evaluation`, and how a successor continues it `failover`; this loop
composes them, and takes in the platform's requests itself.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

from mlless.autotuner import curves
from mlless.contract import (
    ENV_AUDIT, STOP_INTERNAL_ERROR, STOP_INTERRUPTED, STOP_NO_LIVE_WORKERS, STOP_SERVICE_LOST, STOP_SUSPENDED,
)
from mlless.data.dataset import Dataset, DatasetError
from mlless.progress import Progress
from mlless.protocol import keys
from mlless.protocol.framing import FrameError, decode, encode
from mlless.protocol.identity import SUPERVISOR
from mlless.protocol.messages import CLOSE_FINAL, CLOSE_SNAPSHOT, Close, Done, Failed, Finish, Hello, Left, Report
from mlless.runtime.audit import audit_conservation
from mlless.launch.launcher import Launcher
from mlless.launch.platform import Platform
from mlless.runtime.supervisor.accounting import Accounting, StepTotals
from mlless.runtime.supervisor.evaluation import Evaluation, Snapshot
from mlless.runtime.supervisor.failover import Failover, JobState, resumable
from mlless.runtime.supervisor.membership import JobFailed, Membership, WorkerRecord, WorkerState
from mlless.runtime.supervisor.scaling import Scaling
from mlless.runtime.supervisor.status import StatusBoard
from mlless.stopping.rules import Standing, StopRules
from mlless.sync import sync_strategy
from mlless.spec import TrainingJob
from mlless.telemetry.metrics import SupervisorMetrics
from mlless.telemetry.record import RunRecord
from mlless.transport import Transport, TransportError

log = logging.getLogger(__name__)

#: How long workers may take to connect, and to publish their final replicas.
STARTUP_TIMEOUT = 120.0
FINISH_TIMEOUT = 30.0
#: How long a suspended job's checkpoint outlives its other keys (which have the transport's TTL, a day).
SUSPEND_CHECKPOINT_TTL = 30 * 24 * 3600
#: A step open this long without every report gets its predecessor's step-close again. A close the broker lost
#: (a restart drops what its queues held, and a worker whose queue comes back after the supervisor's re-sends
#: misses them) would otherwise stall that worker until it is dropped. Workers ignore a close they have applied,
#: and take silence for twice this (the schema's least liveness.supervisorTimeoutSeconds) as the supervisor lost.
CLOSE_RESEND_SECONDS = 5.0
#: A look at the store that takes longer than this waited out an outage (`_in_an_outage`).
OUTAGE_SIGN_SECONDS = 1.0
#: While an evaluation's snapshot is awaited, the supervisor looks for it this often between messages (`_receive`).
SNAPSHOT_POLL_SECONDS = 0.005


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
        successor: bool = False,
    ) -> None:
        """With `successor`, another supervisor takes over if this one fails (the operator restarts a supervisor
        pod): a job that does not end on a stop rule keeps its state in Redis for it, not only in `run_dir`."""
        self.job = job
        self.successor = successor
        self.completed = False  # the job ended on a stop rule or a suspend: nothing is left to resume
        self.job_id = job_id
        self.transport = transport
        self.launcher = launcher
        self.dataset = Dataset.open(job.dataset_uri)
        self.failover = Failover(transport, run_dir, job_id)
        self.record = RunRecord(run_dir, on_row=self.failover.row)
        self.progress = progress or Progress(enabled=False)
        self.platform = platform or Platform()
        self.started = time.monotonic()
        self.members = Membership(launcher, self.progress)
        self.stopping = StopRules(job.stop, job.evaluate_every)
        self.metrics = metrics or SupervisorMetrics.for_job(job_id, job.pricing)
        self.accounting = Accounting(job, job_id, self.started, self.record, self.metrics, self.progress,
                                     transport.store_instances)
        self.evaluation = Evaluation(job, self.dataset, transport, self.stopping.watch, self.metrics.validation,
                                     self.accounting.count_rejected)
        self.status = StatusBoard(job, self.record, self.platform, self.metrics, self.progress, self.stopping.watch)
        # With MLLESS_AUDIT set, workers track their contribution and the end of the job checks conservation.
        self.x0 = self.evaluation.model.params.copy() if os.environ.get(ENV_AUDIT) else None
        self.reports: dict[int, dict[int, Report]] = {}
        self.closed = 0
        self.cursor = 0
        self.steps_before = 0  # steps closed before this run took over (a resumed suspend, a failover)
        self.takeovers: list[dict[str, Any]] = []  # where each run after the first continued from
        self.held: list[bytes] = []  # hellos that came while this supervisor took over, taken in once workers start
        self.step_opened = self.started
        self.last_close: bytes | None = None  # the newest step-close, and when it was last broadcast
        self.close_sent_at = self.started
        self.announced_live: tuple[int, ...] = ()  # the worker set the newest broadcast close named
        self.training_started = self.started  # when step 0 was closed: the workers had started and connected
        self.closed_at = self.started  # when the newest step was closed
        self.stop_reason: str | None = None
        self.scaling = Scaling(job, self.members, self.platform, self.metrics, self.progress)
        self.sync = sync_strategy(job.sync)  # which closes the workers hear of, what an evaluation's snapshot adds
        self.suspend_checkpoint: bytes | None = None
        self._interrupted = False  # set by SIGINT/SIGTERM, acted on between messages

    @property
    def workers(self) -> dict[int, WorkerRecord]:
        return self.members.workers

    @property
    def live(self) -> tuple[int, ...]:
        return self.members.live

    # ---- lifecycle ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Train to a stop condition; returns the summary written to summary.json.

        Ctrl-C, or SIGTERM when this runs in the main thread (a deleted supervisor pod), ends the job
        cleanly: the workers publish their replicas, the model is saved, and keys and queues are deleted.
        A second one stops waiting for the workers.
        """
        previous = self._catch_signals()
        try:
            curves.warm_up()  # the ETA's and the auto-tuner's fits, imported while the workers start
            self._take_over()
            self._start_workers()
            while self.stop_reason is None:
                self._receive()
                # Once the final close is out, the finish takes in the workers' last messages: the liveness check
                # would take in the Done of a worker whose process ended first (a loaded machine), and the finish,
                # no longer counting it live, would leave its final replica out of the model.
                if self.stop_reason is None:
                    self._check_liveness()
            return self._finish()
        except KeyboardInterrupt:
            self.stop_reason = STOP_INTERRUPTED
            self.transport.broadcast(encode(Finish(sender=SUPERVISOR, step=self.closed)))
            return self._finish()
        except TransportError as exc:
            # The replicas are out of reach with the service; the best snapshot evaluated so far is the model.
            log.error("job %s: %s", self.job_id, exc)
            self.stop_reason = f"{STOP_SERVICE_LOST}: {exc}"
            return self._finish(reachable=False)
        except (JobFailed, DatasetError):  # before the first step: nothing to save, no worker to wait for
            self.launcher.stop_all(grace=0.0)
            raise
        except Exception as exc:
            # Whatever went wrong, the job still ends cleanly: the workers hand in their replicas, the summary and
            # the model are written, and keys and queues are deleted.
            log.exception("job %s: the supervisor failed", self.job_id)
            self.stop_reason = f"{STOP_INTERNAL_ERROR}: {type(exc).__name__}: {exc}"[:500]
            self.transport.broadcast(encode(Finish(sender=SUPERVISOR, step=self.closed)))
            return self._finish()
        finally:
            self.launcher.stop_all()
            self._clean_up()
            self.record.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _clean_up(self) -> None:
        """Delete the job's keys and queues, unless a successor may still need them."""
        if self.successor and not self.completed:
            log.info("job %s: its state stays in Redis for a successor supervisor", self.job_id)
            return
        try:
            log.info("job %s: deleted %d keys", self.job_id, self.transport.delete_job())
        except TransportError as exc:  # every key and queue expires by itself (the transport's TTLs)
            log.warning("job %s: keys and queues left to expire: %s", self.job_id, exc)
        if self.suspend_checkpoint is not None:  # all else is gone; the model to resume from stays a while
            self.transport.put(keys.job_checkpoint(), self.suspend_checkpoint, ttl=SUSPEND_CHECKPOINT_TTL)

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

    def _take_over(self) -> None:
        """Continue where an earlier run left the job (failover.py): its position, totals and history."""
        resumed = self.failover.take_over(self.record, self.evaluation.model.params, self.evaluation.decode_replica,
                                          self.progress)
        if resumed is None:
            return
        self.held, self.takeovers = resumed.held, resumed.takeovers
        if resumed.checkpoint is not None:
            self.steps_before, self.cursor = resumed.checkpoint.steps, resumed.checkpoint.cursor
            self.stopping.watch.best = resumed.checkpoint.best
            self.x0 = None if self.x0 is None else resumed.checkpoint.params.copy()  # what the workers start from
        self.accounting.resume(resumed.state)
        self.members.dropped = list(resumed.state.dropped_workers)
        self.scaling.resume(resumed.state)

    def _start_workers(self) -> None:
        batches_verified = self.dataset.verify_in_background()  # beside the workers' start
        for rank in range(self.job.workers):
            self.members.start(rank)
        for body in self.held:
            self._handle(body)
        self._await_workers(set(self.workers), WorkerState.STARTING, STARTUP_TIMEOUT, "exited before it connected")
        for rank, w in self.workers.items():
            if w.state == WorkerState.STARTING:
                self._drop(rank, "did not connect in time")
        if not self.live:
            raise JobFailed("no worker started; see the worker logs")
        batches_verified()
        self.progress.message(f"job {self.job_id}: {len(self.live)} workers, {self.job.sync.protocol.upper()}")
        self.step_opened = self.training_started = time.monotonic()
        if self.takeovers and "seconds" not in self.takeovers[-1]:
            # How long the takeover kept the job from training: the survivors' hand-in and the new workers' start.
            self.takeovers[-1]["seconds"] = round(self.training_started - self.started, 3)
        self.announced_live = self.live
        # A resumed job's first step trains the batches at its cursor, not those the job began with.
        self.transport.broadcast(encode(Close(sender=SUPERVISOR, step=0, cursor=self.cursor, flags=0, live=self.live, updates=())))

    def _await_workers(self, ranks: set[int], state: WorkerState, timeout: float, exit_reason: str) -> None:
        """Handle messages until none of `ranks` is still in `state`; a process that ends meanwhile is dropped."""
        deadline = time.monotonic() + timeout
        while any(self.workers[r].state == state for r in ranks) and time.monotonic() < deadline:
            self._receive()
            for rank in self.members.ended(self._receive):
                if self.workers[rank].state == state:
                    self._drop(rank, exit_reason)

    # ---- messages ----------------------------------------------------------------------------

    def _receive(self, within: float = 0.2) -> None:
        """Handle the next message, if one comes within `within` seconds; first act on a signal. An awaited
        snapshot is looked for between messages: under rounds the next close may be a round away."""
        self._raise_if_interrupted()
        awaited = self.evaluation.pending_snapshot is not None
        body = self.transport.receive(timeout=min(SNAPSHOT_POLL_SECONDS, within) if awaited else within)
        if body is not None:
            self._handle(body)
        elif awaited:
            self._persist(self.evaluation.evaluate_snapshot(self.steps_before))

    def _handle(self, body: bytes) -> None:
        try:
            msg = decode(body)
        except FrameError as exc:
            self.accounting.count_rejected(1)
            log.error("supervisor: rejected frame: %s", exc)
            return
        worker = self.workers.get(msg.sender)
        if worker is None and isinstance(msg, Hello) and not self.launcher.starts_workers and msg.sender >= 0:
            worker = self.scaling.adopt(msg.sender)
        if worker is None:
            self.accounting.count_rejected(1)
            log.error("supervisor: message from unknown worker %d", msg.sender)
            return
        if isinstance(msg, Hello):
            self.members.said_hello(worker)
        elif isinstance(msg, Report):
            if worker.state == WorkerState.LIVE and msg.step > self.closed:
                self.reports.setdefault(msg.step, {})[msg.sender] = msg
                self.scaling.quality.observe(msg.sender, msg.loss_sum, msg.samples)
                self._close_ready_steps()
        elif isinstance(msg, Done):
            self.members.done(worker)
            self.accounting.count_rejected(msg.rejected_frames)
            self.accounting.repaired_frames += msg.repaired_frames
        elif isinstance(msg, Left) and self.scaling.left(worker, msg.has_replica, self.closed):
            if self.members.active() == 0:
                # Every worker pod was deleted: nobody is left to train, but the leavers' replicas still make the model.
                self.stop_reason = self.stop_reason or STOP_NO_LIVE_WORKERS
            self._close_ready_steps()
        elif isinstance(msg, Failed):
            self._drop(msg.sender, f"failed: {msg.reason}")

    def _close_ready_steps(self) -> None:
        # A round's steps close together (sync/averaging.py), and the workers await the last: it goes out before the
        # rows, metrics and checkpoints of them all are written, which the workers need not wait for.
        recorded = []
        while self.stop_reason is None and self.live and set(self.live) <= set(self.reports.get(self.closed + 1, {})):
            reports = self.reports[self.closed + 1]
            recorded.append(self._close(self.closed + 1, [reports[r] for r in self.live]))
        for record in recorded:
            record()

    def _close(self, step: int, reports: list[Report]) -> Callable[[], None]:
        """Close `step`; returns what records it."""
        totals = StepTotals.of(reports)
        self.accounting.add(totals, self.evaluation.model.loss(totals.loss_sum, totals.samples) if totals.samples else math.nan)
        self.closed = step
        self.cursor += len(reports)
        del self.reports[step]
        self.closed_at = time.monotonic()
        self.stop_reason = self.stopping.check(self._standing(), lambda: self.accounting.cost(self.closed_at, self.members).total)
        joined = False
        if self.stop_reason is None:
            self.scaling.autoscale(step, len(reports), self.accounting.train_loss)
            joined = self.scaling.admit_joiners(step)
        self._broadcast_close(step, reports, joined)
        self.step_opened = time.monotonic()
        snapshot = self.evaluation.evaluate_snapshot(self.steps_before)
        step_record = (self.steps_before + step, totals, self.closed_at, self.cursor / self.dataset.n_batches,
                       self.evaluation.validation, self.members)

        def record() -> None:
            cost = self.accounting.step_closed(*step_record)
            self._persist(snapshot)
            self._sync_platform(cost)
        return record

    def _persist(self, snapshot: Snapshot | None) -> None:
        """Keep what a successor needs (failover.py): the job state, and a checkpoint of a newly evaluated snapshot."""
        checkpoint = snapshot is not None and self.failover.checkpoint_due()
        if checkpoint:
            self.failover.save_checkpoint(snapshot.checkpoint(self.stopping.watch.best))
        if checkpoint or self.failover.state_due():
            self.failover.save_state(self._job_state())

    def _job_state(self) -> JobState:
        return JobState(
            job_id=self.job_id, steps=self.steps_before + self.closed, cursor=self.cursor,
            run_step=self.closed, live=len(self.live), rows=self.record.rows,
            dropped_workers=self.members.dropped, scaling_events=self.scaling.events, decisions=self.scaling.decisions,
            takeovers=self.takeovers,
            **self.accounting.totals(time.monotonic(), self.members),
        )

    def _standing(self) -> Standing:
        return Standing(steps=self.steps_before + self.closed, cursor=self.cursor, n_batches=self.dataset.n_batches,
                        train_loss=self.accounting.train_loss, elapsed=self.accounting.elapsed(self.closed_at))

    def _broadcast_close(self, step: int, reports: list[Report], joined: bool) -> None:
        """Close `step`: final if the job stops, asking for a snapshot if a joiner needs one or an evaluation is due."""
        flags = 0
        if self.stop_reason is not None:
            flags |= CLOSE_FINAL
        elif joined or (self.evaluation.due(step) and self.sync.publishes(step)):
            # A joiner starts from this snapshot; the supervisor evaluates it too. An evaluation waits for a close
            # the workers hear at once (averaging: a round's end), so its snapshot is not a round late.
            flags |= CLOSE_SNAPSHOT
            self.evaluation.request_snapshot(step, self.cursor, self.sync.snapshot_peers(self.live, self.announced_live))
        close = Close(sender=SUPERVISOR, step=step, cursor=self.cursor, flags=flags, live=self.live,
                      updates=tuple(r.sender for r in reports if r.has_update), merges=self.scaling.take_merges(step))
        if not (flags or close.updates or close.merges or close.live != self.announced_live or self.sync.publishes(step)):
            return  # inside a round of model averaging: nobody waits for it (sync/base.py SyncStrategy.publishes)
        self.last_close, self.close_sent_at, self.announced_live = encode(close), time.monotonic(), close.live
        self.transport.broadcast(self.last_close)

    # ---- stop requests, liveness -----------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """End the job at the next step close, as if a stop rule had fired (thread-safe)."""
        self.stopping.request(reason)

    def _check_liveness(self) -> None:
        for rank in self.members.ended(self._receive):
            if self.workers[rank].state in (WorkerState.LIVE, WorkerState.JOINING, WorkerState.READY):
                self._drop(rank, "its process ended")
            elif self.workers[rank].state == WorkerState.LEAVING:
                self.scaling.gone(self.workers[rank])  # it ended without handing on its updates
        if self.last_close is not None and time.monotonic() - self.close_sent_at > CLOSE_RESEND_SECONDS:
            self.transport.broadcast(self.last_close)
            self.close_sent_at = time.monotonic()
        if time.monotonic() - self.step_opened > self.job.worker_timeout_seconds:
            reported = self.reports.get(self.closed + 1, {})
            silent = [rank for rank in self.live if rank not in reported]
            if not (silent and self._in_an_outage()):
                for rank in silent:
                    self._drop(rank, f"no report for step {self.closed + 1} in {self.job.worker_timeout_seconds:g}s")
            self.step_opened = time.monotonic()
        if self.stop_reason is None:
            self._close_ready_steps()

    def _in_an_outage(self) -> bool:
        """Whether the services were out of reach within the worker timeout: silent workers are waiting it out, not
        gone. Looking at the store waits out a Redis outage here too; past the transport's window, `service lost`."""
        looked = time.monotonic()
        self.transport.probe_store()
        now = time.monotonic()
        return now - looked > OUTAGE_SIGN_SECONDS or now - self.transport.reconnected_at < self.job.worker_timeout_seconds

    def _drop(self, rank: int, why: str) -> None:
        if self.members.drop(rank, self.closed, why) and not self.live and self.members.all_started():
            self.stop_reason = self.stop_reason or STOP_NO_LIVE_WORKERS

    # ---- the platform: scale requests, suspends, status ---------------------------------------------

    def request_workers(self, n: int) -> None:
        """Ask for `n` workers (thread-safe); applied at the next step close."""
        self.scaling.request(n)

    def _sync_platform(self, cost_usd: float) -> None:
        """Mirror progress to the platform and take in what its users asked for (kubectl scale, suspend)."""
        self.status.publish(self._standing(), cost_usd, self.evaluation.validation_loss, len(self.live))
        request = self.platform.poll()
        if request is None:
            return
        if request.suspend and self.stopping.requested is None:
            self.request_stop(STOP_SUSPENDED)
        if request.workers is not None and request.workers != self.scaling.desired:
            self.progress.message(f"step {self.closed}: {request.workers} workers requested")
            self.request_workers(request.workers)

    # ---- end of job ------------------------------------------------------------------------------

    def _finish(self, reachable: bool = True) -> dict[str, Any]:
        """The summary and the model; without `reachable` services, from what the supervisor holds itself."""
        finishing = set(self.live) if reachable else set()
        # Workers that left after the last close (stopped with the supervisor: a deleted job, activeDeadlineSeconds;
        # taken out by a close they read only at their round's end) hand on replicas no survivor merges: final ones.
        leaving = {r for r, w in self.workers.items() if w.state == WorkerState.LEAVING} if reachable else set()
        for ranks, state in ((finishing, WorkerState.LIVE), (leaving, WorkerState.LEAVING)):
            self._await_workers(ranks, state, FINISH_TIMEOUT, "its process ended before publishing its replica")
        now = time.monotonic()
        collect = self.evaluation.collect_replicas
        finals = collect(keys.final_replica, [r for r in finishing if self.workers[r].state == WorkerState.DONE])
        workers_final = len(finals)  # a leaver whose Left came after the last close hands its replica in below
        left_at_end = sorted(set(self.scaling.pending_merges)) if reachable else []
        finals += collect(keys.leaver_replica, left_at_end)
        self.scaling.catch_up(finals, collect)
        self.accounting.flush()
        final_model = self.evaluation.final_model([t.arrays for t in finals], self.steps_before + self.closed,
                                                  self.record.run_dir, self.job_id)
        summary = self.accounting.summary(
            stop_reason=self.stop_reason,
            loss_metric=self.evaluation.model.loss_metric,
            final=final_model,
            steps=self.steps_before + self.closed,
            epochs=self.cursor / self.dataset.n_batches,
            now=now,
            startup=self.training_started - self.started,
            members=self.members,
            workers_final=workers_final,
            autoscaler=self.scaling.summary(),
            scaling_events=self.scaling.events,
        )
        summary["takeovers"] = self.takeovers
        if self.x0 is not None and reachable:
            leavers = collect(keys.leaver_replica, [r for r, w in self.workers.items() if w.state == WorkerState.LEFT and r not in left_at_end])
            summary["audit"] = audit_conservation(self.x0, finals, leavers, dropped=bool(self.members.dropped))
        self.record.summary(summary)
        final: dict[str, Any] = {"modelURI": self._export(summary["model_path"])}
        # The suspend checkpoint is the final replicas' model; a best snapshot alone (no replica survived) is not one.
        checkpoint = self.evaluation.final_checkpoint(self.steps_before + self.closed, self.cursor)
        if self.stop_reason == STOP_SUSPENDED and checkpoint is not None:
            self.suspend_checkpoint = checkpoint.frame()
            final["checkpointStep"] = checkpoint.steps
        if resumable(self.stop_reason):
            # A successor, or `mlless train --resume`, continues from the final replicas, else from the newest checkpoint.
            best = self.stopping.watch.best
            self.failover.keep(self._job_state(), checkpoint and dataclasses.replace(checkpoint, best=best),
                               in_redis=self.successor and reachable)
        else:
            self.failover.discard()
            self.completed = True
        self.status.publish(self._standing(), summary["cost_usd"], self.evaluation.validation_loss, len(self.live), final,
                            self.completed)
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
