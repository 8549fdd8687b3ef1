"""A worker function: one replica, trained step by step in lockstep with its peers.

Each step follows the MLLess paper's worker loop: take the next mini-batch
(prefetched), train the replica on it and publish what the sync protocol
shares, report to the supervisor (the report doubles as the announcement),
then wait for the supervisor to close the step and apply the peers' updates
it names. What is published, where, and how it is read and combined is the
protocol's worker half (`sync/base.py`); how long the wait may be put
off is its `must_have_closed` (SSP's slack, averaging's local steps).
"""
from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mlless.contract import BARRIER_PHASES, ENV_AUDIT, EXIT_CHECKPOINTED, STEP_PHASES
from mlless.protocol.framing import FrameError, decode, encode
from mlless.protocol.messages import (
    CLOSE_FINAL, CLOSE_SNAPSHOT, Close, Done, Failed, Finish, Hello, Leave, Left, Report, Takeover, Tensors, Update,
)
from mlless.smoothing import OnlineEwma
from mlless.data.augment import Augment
from mlless.data.dataset import Dataset
from mlless.protocol import keys, layouts
from mlless.runtime.attack import from_env
from mlless.sync import sync_strategy
from mlless.sync.exchanges.base import Published
from mlless.sync.sums import sparse_sum
from mlless.spec import TrainingJob
from mlless.telemetry.timing import PhaseTimer
from mlless.training.replica import Replica
from mlless.training.warm_start import initial_model
from mlless.transport import Transport, UnroutableError

log = logging.getLogger(__name__)


class SupervisorLost(RuntimeError):
    """The supervisor has been silent for much longer than it could legitimately be."""


#: A worker gives up after this many worker timeouts without any message from the supervisor.
SUPERVISOR_SILENCE_FACTOR = 3
#: Under a protocol that publishes once per round, a round's reports go to the supervisor together at its end (one
#: write for H reports: on the embedded broker each write cost a PMF worker about a third of its step), and no later
#: than this after the oldest of them, so the supervisor still hears of a long round while it runs.
REPORT_BATCH_SECONDS = 0.5
#: A worker waiting for a step-close looks this often whether the store lost the job's keys: a peer may be waiting
#: for an update frame of this worker's that went with them.
STORE_PROBE_SECONDS = 1.0


class WorkerExit(Exception):
    """The supervisor ended this worker's part in the job (finish or leave)."""


class Checkpointed(Exception):
    """The invocation's deadline is near: the state is in Redis and the next invocation resumes from it."""


class HandedOver(Exception):
    """A new supervisor took over the job: this worker handed in its replica, and a new process joins its run."""


@dataclass
class _View:
    """What the worker knows of the job from the last step-close it applied."""

    closed: int = -1
    cursor: int = 0
    live: tuple[int, ...] = ()


class Worker:
    def __init__(
        self, job: TrainingJob, rank: int, transport: Transport, dataset: Dataset, deadline: float | None = None
    ) -> None:
        self.job = job
        self.rank = rank
        self.transport = transport
        self.dataset = dataset
        self.sync = sync_strategy(job.sync)
        # MLLESS_AUDIT: the replica sums every update it computed, for the supervisor's conservation check.
        model = initial_model(job, dataset)
        model.share_cores(job.workers)  # locally the job's workers share this machine; a function has its own cores
        self.replica = Replica(model, job.optimizer, self.sync.threshold, audit=bool(os.environ.get(ENV_AUDIT)),
                               accumulator=self.sync.accumulator(model))
        self.feed = self.sync.feed(dataset, job.seed, job.workers, rank)
        # This worker's half of the protocol; a peer's frame the store lost is waited for half the worker timeout.
        self.half = self.sync.worker(rank, self.replica, transport, job.worker_timeout_seconds / 2, self._reject,
                                     self.feed, workers=job.workers)
        # spec.model.augment (the networks): training batches only; the supervisor evaluates the images as prepared.
        self.augment = Augment(**job.model.options.get("augment", {}))
        self.attack = from_env(os.environ, rank)  # mlless train --attack: a robustness test's Byzantine worker
        self.attack_rng = np.random.default_rng([job.seed, rank])
        self.view = _View()
        self.step = 0
        self.started = time.monotonic()
        self.rejected_frames = 0
        self.leave_requested = False
        # A function invocation must return before the platform kills it (monotonic time; None = no limit).
        self.deadline = deadline
        # A step's typical wall time, barrier included: an average, not the maximum, because the first step after
        # a re-invocation waits for peers that are restarting too, and must not make every later invocation end at once.
        self.step_seconds = OnlineEwma(span=9)
        # wait/read/apply happen after a step is reported, so they travel with the next report.
        self._barrier = dict.fromkeys(BARRIER_PHASES, 0.0)
        self._reports: list[bytes] = []  # encoded, not yet posted (REPORT_BATCH_SECONDS)
        self._oldest_report = 0.0

    @property
    def repaired_frames(self) -> int:
        """Peers' update frames the store lost, read again once their senders re-published them."""
        return self.half.exchange.repaired

    def _reject(self, what: str) -> None:
        self.rejected_frames += 1
        log.error("worker %d: rejected %s", self.rank, what)

    # ---- main loop -------------------------------------------------------------------------

    def run(self) -> None:
        """Train until the job ends for this worker; raises `Checkpointed` if the invocation's deadline comes first."""
        self._say_hello()
        try:
            while True:
                started = time.monotonic()
                self._await_close(self.sync.must_have_closed(self.step))
                if self.leave_requested:
                    self._leave()
                if self._deadline_near():
                    self._checkpoint()
                self.step += 1
                self._train_step()
                self.step_seconds.update(time.monotonic() - started)
        except WorkerExit:
            pass
        finally:
            self.feed.close()

    # ---- invocation deadline: checkpoint and resume -------------------------------------------

    def _deadline_near(self) -> bool:
        # Room for two typical steps and a second: the caller's margin before the platform's timeout absorbs outliers.
        return self.deadline is not None and time.monotonic() + 2 * (self.step_seconds.value or 0.0) + 1.0 >= self.deadline

    def _checkpoint(self) -> None:
        """Between steps, everything this worker knows goes to Redis; queued control messages wait in its queue."""
        self._post_reports()
        position = layouts.WorkerPosition(self.step, self.view.closed, self.view.cursor, self.rejected_frames, self.view.live)
        arrays = self.replica.snapshot(optimizer=True) | position.arrays()
        frame = encode(Tensors(sender=self.rank, step=self.step, arrays=arrays))
        self.transport.put(keys.checkpoint(self.rank), frame)
        log.info("worker %d: checkpointed at step %d before the invocation deadline", self.rank, self.step)
        raise Checkpointed

    def start_from_job_checkpoint(self) -> None:
        """A resumed job starts from its checkpoint (if there is one): the model its supervisor merged at a suspend,
        or the one a new supervisor continues from. Read when step 0 is closed: by then it is written."""
        frame = self.transport.get_many([keys.job_checkpoint()])[0]
        if frame is None:
            return
        checkpoint = self._decode_replica(frame, None, "job checkpoint")
        if checkpoint is None:
            raise RuntimeError("the job's suspend checkpoint is not a valid model")
        try:  # with the optimizer state the job's replicas share, if they share one (`SyncStrategy.share_optimizer`)
            self.replica.restore(checkpoint.arrays)
        except ValueError as exc:  # another optimizer's (a suspended job's spec changed): every worker starts afresh
            log.warning("worker %d: the job's checkpoint: %s; the optimizer starts afresh", self.rank, exc)
            plain = {k: v for k, v in checkpoint.arrays.items() if not k.startswith(layouts.OPTIMIZER_PREFIX)}
            self.replica.restore(plain)

    def resume(self) -> None:
        """Continue from the checkpoint the previous invocation of this rank wrote."""
        frame = self.transport.get_many([keys.checkpoint(self.rank)])[0]
        checkpoint = self._decode_replica(frame, self.rank, "checkpoint")
        if checkpoint is None:
            raise RuntimeError(f"no valid checkpoint of worker {self.rank} to resume from")
        try:
            position = layouts.WorkerPosition.read(checkpoint.arrays)
        except ValueError as exc:
            raise RuntimeError(f"checkpoint of worker {self.rank}: {exc}") from None
        self.replica.restore(checkpoint.arrays)
        self.step, self.rejected_frames = position.step, position.rejected_frames
        self.view = _View(closed=position.closed, cursor=position.cursor, live=position.live)

    def _say_hello(self) -> None:
        """Announce this worker, waiting for the supervisor's queue if the worker started first (pods start in any order)."""
        hello = encode(Hello(sender=self.rank, step=0, pid=os.getpid()))
        deadline = time.monotonic() + SUPERVISOR_SILENCE_FACTOR * self.job.worker_timeout_seconds
        delay = 0.05
        while True:
            try:
                self.transport.send_to_supervisor(hello)
                return
            except UnroutableError:
                if time.monotonic() > deadline:
                    raise SupervisorLost("the supervisor's queue never appeared") from None
                time.sleep(delay)
                delay = min(2 * delay, 2.0)

    def _train_step(self) -> None:
        timer = PhaseTimer()
        ahead = self.step - self.view.closed - 1
        position = self.feed.schedule.position(self.view.cursor, self.view.live, self.rank, ahead)
        batch = self.augment.step(self.feed.take(position, self.step, self.view.live, self.rank), self.job.seed,
                                  self.rank, self.step)
        timer.lap("fetch")

        self.replica.workers = len(self.view.live) if self.sync.sums_updates else 1
        result = self.half.train(batch, self.feed.schedule.progress(position), self.step,
                                 alone=self.view.live == (self.rank,))
        if self.attack is not None:
            attacked = self.attack.corrupt(result, self.attack_rng)
            self.half.hold(self.step, result, attacked)
            result = attacked
        timer.record(compute=result.compute_seconds, filter=result.filter_seconds)
        bytes_sent = self.half.publish(self.step, result)
        timer.lap("write")

        phases = timer.seconds | self._barrier  # this step's own phases, the step before's barrier phases
        timings = tuple(phases[p] for p in STEP_PHASES)
        merged, read = self.half.exchange.traffic()  # at the last close, like the barrier phases
        report = Report(
            sender=self.rank,
            step=self.step,
            loss_sum=result.loss_sum,
            samples=result.samples,
            has_update=bytes_sent > 0,
            bytes_sent=bytes_sent + merged,
            entries_sent=len(result.indices),
            entries_pending=self.replica.pending_count(),
            timings=timings,
            bytes_read=read,
            staleness=ahead,
        )
        if not self._reports:
            self._oldest_report = time.monotonic()
        self._reports.append(encode(report))
        if self.sync.publishes(self.step) or time.monotonic() - self._oldest_report > REPORT_BATCH_SECONDS:
            self._post_reports()

    def _post_reports(self) -> None:
        """Post the reports held back inside a round: before the worker waits for a close, or says anything else."""
        if self._reports:
            self.transport.post_many_to_supervisor(self._reports)
            self._reports = []

    # ---- control messages ------------------------------------------------------------------

    def _await_close(self, step: int) -> None:
        """Block until `step` is closed, applying the closes on the way; when not blocked, apply what has arrived.

        Once the awaited close is applied the worker goes on: whatever else is queued waits for the next call,
        one step later, rather than costing one more round trip to the broker now.
        """
        wait_started = time.perf_counter()
        self._barrier = dict.fromkeys(BARRIER_PHASES, 0.0)
        blocking = self.view.closed < step
        if blocking or self.leave_requested:
            self._post_reports()
        if not blocking and self.step and not self.sync.publishes(self.step) and not self.leave_requested:
            return  # inside a round of model averaging no close is news: what came waits for the round's end
        awaited = blocking
        silent_since = probed = time.monotonic()
        # A supervisor that waits repeats its newest close, so once the job runs, silence means it is gone, and a
        # function must not keep billing while it waits for nobody. Before the first close it may still be
        # waiting for every worker to start.
        patience = self.job.supervisor_timeout_seconds if self.view.closed >= 0 else \
            SUPERVISOR_SILENCE_FACTOR * self.job.worker_timeout_seconds
        while True:
            body = self.transport.receive(timeout=0.5 if blocking else 0.0)
            if body is None:
                if not blocking or self.leave_requested:
                    break
                silent_since = max(silent_since, self.transport.reconnected_at)  # an outage is not the supervisor's
                if time.monotonic() - probed > STORE_PROBE_SECONDS:
                    self.transport.probe_store()
                    self.half.exchange.republish_if_store_lost()
                    probed = time.monotonic()
                if time.monotonic() - silent_since > patience:
                    raise SupervisorLost(f"no message from the supervisor for {time.monotonic() - silent_since:.0f}s")
                continue
            self._barrier["wait"] += time.perf_counter() - wait_started
            if self._handle(body):  # a forged or garbled message is not the supervisor speaking
                silent_since = time.monotonic()
            wait_started = time.perf_counter()
            blocking = self.view.closed < step
            if awaited and not blocking:
                break

    def _handle(self, body: bytes) -> bool:
        """Act on one control message; False if it was rejected."""
        try:
            msg = decode(body)
        except FrameError as exc:
            self._reject(f"control frame: {exc}")
            return False
        if isinstance(msg, Close):
            self._apply_close(msg)
        elif isinstance(msg, Finish):
            self._finish()
        elif isinstance(msg, Takeover):
            self._answer_takeover()
        elif isinstance(msg, Leave) and msg.rank == self.rank:
            self._leave()
        else:
            log.debug("worker %d: ignoring %s", self.rank, type(msg).__name__)
        return True

    def _apply_close(self, close: Close) -> None:
        if close.step <= self.view.closed:
            return
        if self.view.closed < 0 and close.step == 0:
            self.start_from_job_checkpoint()
        if self.view.closed < 0 and close.step > 0:
            # A late joiner (scale-out): it starts from a live replica once the job lists it.
            if self.rank in close.live:
                self._join(close)
            return
        started = time.perf_counter()
        updates = self.half.gather(close)
        read_done = time.perf_counter()
        self.half.combine(close, updates)
        if close.merges:
            self._merge_leavers(close.merges)
        if self.rank not in close.live:
            # Its own update of this step is named by the close too, and its peers apply it as the protocol combines
            # it (averaging: a share of it); combining first makes the leaver's replica agree with what they applied.
            self._leave(after=close.step)
        before, self.view = self.view.live, _View(closed=close.step, cursor=close.cursor, live=close.live)
        if close.flags & CLOSE_SNAPSHOT:
            self._snapshot(close, before)
        self._barrier["read"] += read_done - started
        self._barrier["apply"] += time.perf_counter() - read_done
        if close.flags & CLOSE_FINAL:
            self.half.withdraw_unread(close.step)  # frames of steps trained past the job's end, which no one reads
            self._finish()

    def _snapshot(self, close: Close, before: tuple[int, ...]) -> None:
        """The close's snapshot, after one that named `before`: its donor, the first worker that was in the job,
        puts its replica, with its pending entries only if a joiner starts from it (replica minus them); under a
        protocol that keeps rows at home, every other worker puts its pending entries, which the supervisor adds
        to the donor's replica (`SyncStrategy.keeps_home`). Frames published for later steps (a round's end, SSP's
        slack) are in a replica but not yet shared: counted as pending, a joiner starting from the snapshot minus
        them, or the supervisor adding them, does not count them twice."""
        unshared = self.half.exchange.unread(close.step)
        senders = [r for r in close.live if r in before] or list(close.live)
        if senders[0] == self.rank:
            joiners = set(close.live) - set(before)
            # Replicas that step one optimizer state hand it on with the snapshot, to a joiner and to the job
            # checkpoint the supervisor makes of it (`Checkpoint.optimizer`).
            self.transport.put(keys.snapshot(), self._replica_frame(unshared, pending=bool(joiners),
                                                                    optimizer=self.sync.share_optimizer))
        elif self.sync.keeps_home:
            self.transport.put(keys.snapshot_pending(self.rank), self._replica_frame(unshared, params=False))

    @property
    def _stands_at(self) -> int:
        """The step the replica stands at, for the frames that carry it: the newest closed one, or 0 while none is
        (the job's start; a frame's step is never negative): a job stopped as its workers started ended each one
        on a replica frame it could not encode."""
        return max(self.view.closed, 0)

    def _replica_frame(self, unshared: Sequence[Published] = (), params: bool = True, pending: bool = True,
                       optimizer: bool = False) -> bytes:
        """The replica: its `params` and its `pending` entries, with `unshared` published updates counted among
        them, and with `optimizer` its optimizer's state."""
        arrays = self.replica.snapshot(optimizer=optimizer)
        if unshared:
            indices, values = layouts.pending(arrays)
            entries, sums, _ = sparse_sum([indices, *(p.indices for p in unshared)], [values, *(p.values for p in unshared)])
            arrays |= {layouts.PENDING_INDICES: entries.astype(np.int32), layouts.PENDING_VALUES: sums.astype(np.float32)}
        if not params:
            arrays = {name: arrays[name] for name in (layouts.PENDING_INDICES, layouts.PENDING_VALUES)}
        if not pending:
            arrays = {name: value for name, value in arrays.items()
                      if name == layouts.PARAMS or name.startswith(layouts.OPTIMIZER_PREFIX)}
        # only ever put through the transport, which seals it: the MAC stands for the checksum
        return encode(Tensors(sender=self.rank, step=self._stands_at, arrays=arrays), sealed=True)

    def _decode_replica(self, frame: bytes | None, rank: int | None, what: str) -> Tensors | None:
        try:
            if frame is None:
                raise FrameError("missing")
            msg = decode(frame)
            if not isinstance(msg, Tensors) or rank not in (None, msg.sender):
                raise FrameError(f"expected a replica of worker {rank}")
            rank = msg.sender
            layouts.check_params(msg.arrays, self.replica.params)
            idx, val = layouts.pending(msg.arrays)
            Update(sender=rank, step=msg.step, indices=idx, values=val).check_size(self.replica.params.shape[0])
        except (FrameError, TypeError, ValueError) as exc:
            self._reject(f"{what} of worker {rank}: {exc}")
            return None
        return msg

    def _merge_leavers(self, ranks: tuple[int, ...]) -> None:
        """Add each leaver's unsent accumulated updates, exactly once, to this replica.

        Averaging the leaver's replica in, x ← (x + x_leaving)/2, would be wrong: replicas
        differ only by their own unsent accumulators (x_k = shared + δ_k), so the
        average would halve both δ_leaving and this worker's δ_k while δ_k is
        still sent later in full. Adding δ_leaving instead keeps every replica
        equal to shared + its own δ, and reintegrates the leaver's updates exactly.
        Under BSP δ_leaving is empty, so nothing changes, as it should for v = 0.
        """
        frames = self.transport.get_many([keys.leaver_replica(r) for r in ranks])
        for rank, frame in zip(ranks, frames):
            replica = self._decode_replica(frame, rank, "leaver replica")
            if replica is not None:
                self.replica.apply(*layouts.pending(replica.arrays))

    def _join(self, close: Close) -> None:
        """Start from the donor's snapshot of step `close.step`, minus the donor's own unsent updates."""
        deadline = time.monotonic() + self.job.worker_timeout_seconds
        while time.monotonic() < deadline:
            frame = self.transport.get_many([keys.snapshot()])[0]
            replica = self._decode_replica(frame, None, "snapshot") if frame else None  # empty: asked for, not put yet
            if replica is not None and replica.step == close.step:
                self.replica.adopt_shared(replica.arrays)
                self.view = _View(closed=close.step, cursor=close.cursor, live=close.live)
                self.step = close.step
                return
            time.sleep(0.005)
        raise RuntimeError(f"no snapshot of step {close.step} arrived in {self.job.worker_timeout_seconds:g}s")

    def _finish(self) -> None:
        self._publish_final_replica()
        raise WorkerExit

    def _answer_takeover(self) -> None:
        """A new supervisor took over: it continues from this replica; a new process of this rank joins its run.
        One that has not trained yet says hello again instead (the new supervisor cleared what it had sent)."""
        if self.view.closed < 0:
            self._say_hello()
            return
        self._publish_final_replica()
        raise HandedOver

    def _publish_final_replica(self) -> None:
        """Publish the replica as final, and tell the supervisor."""
        self._post_reports()
        # With the optimizer state the replicas share, if they do: a job resumed from final replicas continues it.
        self.transport.put(keys.final_replica(self.rank), self._replica_frame(optimizer=self.sync.share_optimizer))
        seconds = time.monotonic() - self.started
        done = Done(sender=self.rank, step=self._stands_at, seconds=seconds, rejected_frames=self.rejected_frames,
                    repaired_frames=self.repaired_frames)
        self.transport.send_to_supervisor(encode(done))

    def _leave(self, after: int | None = None) -> None:
        """Hand on the unsent accumulated updates in the leaver's replica frame; the survivors add them in. Taken out
        by the close of step `after`, this worker also takes back what it published for later steps."""
        self._post_reports()
        if after is not None:
            self.half.withdraw_unread(after)
        # A leaver's replica is a final one when it leaves after the job's last close: with the shared optimizer state.
        self.transport.put(keys.leaver_replica(self.rank), self._replica_frame(optimizer=self.sync.share_optimizer))
        self.transport.send_to_supervisor(encode(Left(sender=self.rank, step=self._stands_at, has_replica=True)))
        raise WorkerExit


def serve(job: TrainingJob, rank: int, transport: Transport, deadline: float | None = None, resume: bool = False) -> int:
    """Run worker `rank` until the supervisor finishes the job, or until `deadline` (monotonic) is near.

    Returns the exit code of the process: 0 when the job ended for this worker,
    EXIT_CHECKPOINTED when it checkpointed for the next invocation, 1 on failure.
    """
    # The supervisor owns shutdown: a Ctrl-C in the terminal must not kill workers mid-write.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    dataset = Dataset.open(job.dataset_uri, cache_batches=job.cache_batches)
    worker = Worker(job, rank, transport, dataset, deadline)

    def leave_on_sigterm(signum: int, frame: object) -> None:
        # Deleting a worker pod sends SIGTERM: leave gracefully, handing on the unsent updates.
        worker.leave_requested = True

    signal.signal(signal.SIGTERM, leave_on_sigterm)
    try:
        if resume:
            worker.resume()
        worker.run()
    except (Checkpointed, HandedOver):
        return EXIT_CHECKPOINTED
    except Exception as exc:
        log.exception("worker %d failed", rank)
        reason = f"{type(exc).__name__}: {exc}"[:500]
        transport.send_to_supervisor(encode(Failed(sender=rank, step=worker.step, reason=reason)))
        return 1
    finally:
        transport.close()
    return 0

