"""Evaluating replicas: snapshots during training, the best one, and the model a job hands back."""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from mlless.smoothing import OnlineEwma
from mlless.data.batches import Batch
from mlless.data.dataset import Dataset
from mlless.protocol import keys, layouts
from mlless.protocol.framing import FrameError, decode
from mlless.protocol.messages import Tensors, Update
from mlless.stopping.rules import Best, ValidationWatch
from mlless.runtime.supervisor.failover import Checkpoint
from mlless.runtime.supervisor.membership import JobFailed
from mlless.sync import sync_strategy
from mlless.spec import TrainingJob
from mlless.spec.models import model_type
from mlless.training.warm_start import initial_model
from mlless.transport import Transport

log = logging.getLogger(__name__)

#: Evaluations during training read at most this many validation rows (the final ones read them all): on 10M
#: ratings the whole split is 1M rows, and evaluating it every few steps cost more than training.
EVALUATION_ROWS = 100_000
#: Evaluations may take at most this share of the job's time: evaluation.everySteps is stretched when a
#: snapshot and its evaluation take longer than that (a large model with fast steps).
EVALUATION_SHARE = 0.1


@dataclass(frozen=True)
class FinalModel:
    """The model a job hands back, and how it was chosen."""

    validation_loss: float | None  # of the model handed back (None: there is none)
    final_loss: float | None  # of the final replicas' model (`layouts.model_of`)
    model_step: int | None
    best: Best | None  # the best snapshot, its loss read on the whole validation split
    spread: float | None  # largest difference between a final replica and their model
    model_path: Path | None
    #: The handed-back model's figures on the validation split besides its loss (`Model.scores`).
    scores: dict[str, float] = dataclasses.field(default_factory=dict)
    #: The files `Model.save_native` wrote beside model_path (a network's model.pt).
    native_files: list[str] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class Snapshot:
    """An evaluated snapshot: the model after `steps` steps (of every run) and `cursor` mini-batches, with the
    optimizer state its replicas share, if they share one (`SyncStrategy.share_optimizer`)."""

    steps: int
    cursor: int
    params: np.ndarray
    optimizer: dict[str, np.ndarray] | None = None

    def checkpoint(self, best: Best | None) -> Checkpoint:
        """This snapshot as a model to resume from, beside the `best` one so far."""
        return Checkpoint(self.steps, self.cursor, self.params, best, self.optimizer)


class Evaluation:
    """One model instance for the supervisor's evaluations; replicas are copied into it."""

    def __init__(
        self, job: TrainingJob, dataset: Dataset, transport: Transport, watch: ValidationWatch,
        on_validation: Callable[[float], None], count_rejected: Callable[[int], None],
    ) -> None:
        self.job = job
        self.transport = transport
        self.watch = watch
        self.on_validation = on_validation
        self.count_rejected = count_rejected
        for error in model_type(job.model.type).dataset_errors(job.model.options, dataset)[:1]:
            raise JobFailed(error)  # before any worker starts
        self.model = initial_model(job, dataset)
        self.merge_final_replicas = sync_strategy(job.sync).merge_final_replicas
        self.validation_batch = dataset.validation()
        self.evaluation_batch = self.validation_batch.head(EVALUATION_ROWS)
        self.validation: tuple[int, float] | None = None  # (step of its snapshot in the job, loss) of the newest evaluation
        self.pending_snapshot: int | None = None
        self.snapshot_cursor = 0  # the mini-batch cursor at the pending snapshot's step
        self.snapshot_peers: tuple[int, ...] = ()  # whose pending entries the snapshot adds (`snapshot_peers`)
        self.donor: Tensors | None = None  # the pending snapshot's donor replica, once it arrived
        self.peer_entries: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # the peers' pending entries that arrived
        self.snapshot_requested = 0.0  # when the pending snapshot was asked for (monotonic)
        self.last_evaluated = 0  # step of the newest snapshot asked for
        self.evaluation_seconds = OnlineEwma(span=5)  # the supervisor's CPU-seconds to evaluate a snapshot
        self.final_params: np.ndarray | None = None  # the final replicas' model, which a suspended job resumes from
        self.final_optimizer: dict[str, np.ndarray] | None = None  # ... and the optimizer state they share, if they do

    @property
    def validation_loss(self) -> float | None:
        return self.validation[1] if self.validation else None

    def due(self, step: int) -> bool:
        """Every evaluation.everySteps steps, or less often if evaluating would take over EVALUATION_SHARE of the time.

        A snapshot that never arrived (its donor left) is simply replaced by the next one.
        """
        if not self.job.evaluate_every or step - self.last_evaluated < self.job.evaluate_every:
            return False
        # In time, not steps: under a protocol with rounds a round's steps close together at its end, and a step
        # time averaged over closes would be a fraction of the real one, and stretch the interval as much.
        cost = self.evaluation_seconds.value
        return not cost or time.monotonic() - self.snapshot_requested >= cost / EVALUATION_SHARE

    def request_snapshot(self, step: int, cursor: int, peers: tuple[int, ...] = ()) -> None:
        """The close of `step`, with the mini-batch cursor at `cursor`, asks its donor for a snapshot, and `peers`
        for their pending entries (`SyncStrategy.snapshot_peers`)."""
        self.pending_snapshot = self.last_evaluated = step
        self.snapshot_cursor = cursor
        self.snapshot_peers, self.donor, self.peer_entries = peers, None, {}
        self.snapshot_requested = time.monotonic()
        # Emptied, the keys read as not there yet until the new frames come: polling an earlier snapshot's frames
        # read megabytes every few milliseconds only to find their step stale.
        for key in [keys.snapshot(), *map(keys.snapshot_pending, peers)]:
            self.transport.put(key, b"")

    def evaluate_snapshot(self, steps_before: int) -> Snapshot | None:
        """Evaluate the snapshot asked for, if it has arrived; `steps_before` were closed before this run."""
        if self.pending_snapshot is None:
            return None
        started = time.thread_time()
        if self.donor is None:
            frame = self.transport.get_many([keys.snapshot()])[0]
            tensors = self.decode_replica(frame) if frame else None
            if tensors is None or tensors.step != self.pending_snapshot:
                return None
            self.donor = tensors
        params = self._with_peers(self.donor)
        if params is None:
            return None
        self.validation = (steps_before + self.pending_snapshot, self.evaluate(params, self.evaluation_batch))
        self.watch.observe(*self.validation, params)
        # What evaluating costs the job is this work's CPU time: counting the wait for the snapshot (a round's end)
        # or the wall time on cores the workers share would space the evaluations by that wait, not by their cost.
        self.evaluation_seconds.update(time.thread_time() - started)
        self.on_validation(self.validation[1])
        self.pending_snapshot = None
        return Snapshot(self.validation[0], self.snapshot_cursor, params,
                        layouts.optimizer_state(self.donor.arrays) or None)

    def _with_peers(self, donor: Tensors) -> np.ndarray | None:
        """The donor's replica plus its peers' pending entries of the same step; None until every one arrived (a
        peer that left leaves this snapshot to be replaced by the next)."""
        params = donor.arrays[layouts.PARAMS]
        missing = [r for r in self.snapshot_peers if r != donor.sender and r not in self.peer_entries]
        for rank, frame in zip(missing, self.transport.get_many([keys.snapshot_pending(r) for r in missing])):
            try:
                msg = decode(frame) if frame else None
                if not isinstance(msg, Tensors) or msg.sender != rank or msg.step != donor.step:
                    continue  # not there yet
                idx, values = layouts.pending(msg.arrays)
                Update(sender=rank, step=msg.step, indices=idx, values=values).check_size(params.shape[0])
                self.peer_entries[rank] = idx, values
            except (FrameError, ValueError) as exc:
                self.count_rejected(1)
                log.error("supervisor: rejected pending entries of worker %d: %s", rank, exc)
        if len(self.peer_entries) < len(self.snapshot_peers) - (donor.sender in self.snapshot_peers):
            return None
        params = params.copy()
        for idx, values in self.peer_entries.values():
            params[idx] += values  # a replica's pending entries never repeat an index
        return params

    def decode_replica(self, frame: bytes) -> Tensors | None:
        """A replica frame whose parameters fit the model, or None (counted as rejected)."""
        try:
            msg = decode(frame)
            if not isinstance(msg, Tensors):
                raise FrameError("expected a replica (Tensors frame)")
            layouts.check_params(msg.arrays, self.model.params)
        except ValueError as exc:
            self.count_rejected(1)
            log.error("supervisor: rejected replica: %s", exc)
            return None
        return msg

    def collect_replicas(self, key: Callable[[int], str], ranks: list[int]) -> list[Tensors]:
        frames = self.transport.get_many([key(r) for r in ranks]) if ranks else []
        replicas = []
        for rank, frame in zip(ranks, frames):
            tensors = self.decode_replica(frame) if frame is not None else None
            if tensors is None:
                log.error("worker %d: replica %s missing or invalid; left out", rank, key(rank))
                continue
            replicas.append(tensors)
        return replicas

    def final_checkpoint(self, steps: int, cursor: int) -> Checkpoint | None:
        """What a suspended or interrupted job resumes from: the final replicas' model after `steps` steps and `cursor`
        mini-batches, with the optimizer state they share; None if no replica survived (a best snapshot alone is
        not one)."""
        if self.final_params is None:
            return None
        return Checkpoint(steps, cursor, self.final_params, optimizer=self.final_optimizer)

    def evaluate(self, params: np.ndarray, batch: Batch) -> float:
        """Loss of a replica (its shape was checked when it was decoded) on `batch`."""
        self.model.params[:] = params
        loss_sum, n = self.model.evaluate(batch)
        return self.model.loss(loss_sum, n)

    def final_model(self, replicas: list[layouts.Arrays], step: int, run_dir: Path, job_id: str) -> FinalModel:
        """Merge the final replicas of `step` (`SyncStrategy.merge_final_replicas`), pick the model to hand back and
        save it to run_dir/model.npz, and in its library's format beside it (`Model.save_native`); `final_params`,
        what a suspended job resumes from, is their `layouts.model_of`, and `final_optimizer` the optimizer state
        they share (`SyncStrategy.share_optimizer`; None if they carry none)."""
        validation_loss = final_loss = None
        spread = None
        model_path = None
        model_step = None
        best = self.watch.best  # the best snapshot, its loss re-read on the whole validation split
        if best is not None and len(self.evaluation_batch) < len(self.validation_batch):
            best = dataclasses.replace(best, loss=self.evaluate(best.params, self.validation_batch))
        if replicas:
            self.final_params = layouts.model_of(replicas)
            self.final_optimizer = next((state for r in replicas if (state := layouts.optimizer_state(r))), None)
            spread = max(float(np.max(np.abs(r[layouts.PARAMS] - self.final_params))) for r in replicas)
            merged = self.merge_final_replicas(replicas)
            validation_loss = final_loss = self.evaluate(merged, self.validation_batch)
            model_step = step
            self.model.params[:] = merged
        # Hand back the best snapshot evaluated when the model trained past it (overfitting, a noisy end), when
        # the final replicas are not finite, or when none survived (every worker diverged or was lost).
        if best is not None and not (final_loss is not None and final_loss <= best.loss):
            self.model.params[:] = best.params
            validation_loss, model_step = best.loss, best.step
        scores: dict[str, float] = {}
        native: list[str] = []
        if validation_loss is not None:
            model_path = run_dir / "model.npz"
            self.model.save(model_path, {"job": self.job.name, "job_id": job_id, "steps": model_step})
            native = self.model.save_native(run_dir)
            scores = self.model.scores(self.validation_batch)
        return FinalModel(validation_loss, final_loss, model_step, best, spread, model_path, scores, native)
