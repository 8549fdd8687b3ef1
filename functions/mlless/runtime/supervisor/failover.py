"""Supervisor failover: the job's state, kept where a successor finds it, and the takeover.

The workers' replicas hold the model, but where the job stands (steps, the
mini-batch cursor), what it has cost, who was dropped and the best model seen
so far live only in the supervisor, and a supervisor can die: kill -9, a lost
node, an evicted pod. So as the job runs the supervisor persists

- the job state (`JobState`, JSON), at a step close at most every STATE_SECONDS;
- a model checkpoint: the newest evaluated snapshot and the best one, as
  often as CHECKPOINT_SHARE of the job's time allows;
- the per-step rows, in blocks of ROWS_PER_BLOCK;

in Redis, where the supervisor pod the operator recreates finds them, and in
the run directory, where `mlless train --out RUNDIR --resume` finds them after
the embedded transport died with its process.

A successor first clears what the old run left in Redis and RabbitMQ, then
asks any surviving workers to hand in their replicas (`Takeover`): when they
are newer than the checkpoint, the job continues from them with every update
they hold. They end, to be run again (a pod's container restarts), and the
successor starts its workers from that model. Step numbers, the cursor, the cost and the run record
continue where the job was.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mlless.contract import (
    STOP_DIVERGED, STOP_INTERNAL_ERROR, STOP_INTERRUPTED, STOP_NO_LIVE_WORKERS, STOP_SERVICE_LOST,
)
from mlless.progress import Progress
from mlless.protocol import keys, layouts
from mlless.protocol.framing import FrameError, decode, encode
from mlless.protocol.identity import SUPERVISOR
from mlless.protocol.messages import Done, Hello, Takeover, Tensors
from mlless.runtime import json_object
from mlless.stopping.rules import Best
from mlless.telemetry.record import RunRecord
from mlless.transport import Transport

log = logging.getLogger(__name__)

#: The job state is saved at a step close at most this often: its age bounds what a successor re-counts.
STATE_SECONDS = 1.0
#: Model checkpoints take at most this share of the job's time (a checkpoint of a large model takes a while) ...
CHECKPOINT_SHARE = 0.05
#: ... and come at most this often.
CHECKPOINT_SECONDS = 0.5
#: Rows are stored in Redis in blocks of this many; the newest block is rewritten as it fills.
ROWS_PER_BLOCK = 64
#: How long a successor waits for surviving workers to hand in their replicas, and for the next one after one has.
HARVEST_SECONDS = 5.0
HARVEST_QUIET_SECONDS = 1.0
#: The run directory's copies.
STATE_FILE = "state.json"
CHECKPOINT_FILE = "checkpoint.bin"


class ResumeError(RuntimeError):
    """There is nothing valid to resume from; the message names the file or key."""


def resumable(stop_reason: str | None) -> bool:
    """A job that ended on a fault or a Ctrl-C, rather than a stop rule or a suspend, may be resumed."""
    return stop_reason is not None and (stop_reason in (STOP_NO_LIVE_WORKERS, STOP_INTERRUPTED)
                                        or stop_reason.startswith(STOP_SERVICE_LOST))


def failed(summary: dict[str, Any]) -> bool:
    """No model, or the job ended on a fault or diverged rather than on a stop rule (its model is the best
    snapshot)."""
    reason = summary["stop_reason"]
    return (summary["validation_loss"] is None or reason in (STOP_NO_LIVE_WORKERS, STOP_DIVERGED)
            or reason.startswith((STOP_SERVICE_LOST, STOP_INTERNAL_ERROR)))


@dataclass
class JobState:
    """Where a job stands and what it has done, at a step close; JSON in Redis and in the run directory."""

    job_id: str
    steps: int = 0  # steps closed, in every run
    cursor: int = 0  # mini-batches taken
    run_step: int = 0  # the same step as this run numbers it: what its workers' replicas carry
    live: int = 0  # workers in that step
    wall_seconds: float = 0.0  # of every run
    worker_seconds: list[float] = field(default_factory=list)  # billed seconds of every worker invocation
    samples: int = 0
    bytes_sent: int = 0
    compute_seconds: float = 0.0
    rejected_frames: int = 0
    repaired_frames: int = 0
    train_loss: float | None = None
    rows: int = 0  # rows in metrics.jsonl
    ended: bool = False  # the run ended with its workers: none is left to hand in a replica
    dropped_workers: list[dict[str, Any]] = field(default_factory=list)
    scaling_events: list[dict[str, Any]] = field(default_factory=list)
    decisions: dict[str, int] = field(default_factory=dict)
    takeovers: list[dict[str, Any]] = field(default_factory=list)  # each run after the first: where it continued from

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), allow_nan=False).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> JobState:
        """ValueError naming the field when `raw` is not a job state this version wrote."""
        data = json_object(raw)
        values = {}
        for f in fields(cls):
            if f.name not in data:
                raise ValueError(f"{f.name}: missing")
            values[f.name] = _checked(f.name, data[f.name], f.type)
        return cls(**values)


_TYPES: dict[str, tuple[type, ...]] = {
    "bool": (bool,), "str": (str,), "int": (int,), "float": (int, float), "list[float]": (list,), "list[dict[str, Any]]": (list,),
    "dict[str, int]": (dict,), "float | None": (int, float, type(None)),
}


def _checked(name: str, value: Any, annotation: str) -> Any:
    kinds = _TYPES[annotation]
    if isinstance(value, bool) != (annotation == "bool") or not isinstance(value, kinds):
        raise ValueError(f"{name}: expected {annotation}, got {type(value).__name__}")
    if isinstance(value, (int, float)) and value < 0:
        raise ValueError(f"{name}: negative")
    if annotation == "list[float]" and not all(isinstance(v, (int, float)) and v >= 0 for v in value):
        raise ValueError(f"{name}: expected non-negative seconds")
    if annotation == "list[dict[str, Any]]" and not all(isinstance(v, dict) for v in value):
        raise ValueError(f"{name}: expected a list of objects")
    return value


@dataclass(frozen=True)
class Checkpoint:
    """A model to resume from, its parameters at `steps` and `cursor`, and the best snapshot so far. Under a protocol
    whose replicas step one optimizer state (`SyncStrategy.share_optimizer`: gradient averaging's Adam moments and
    step count), `optimizer` is that state, which every worker of the resumed job starts from: without it they would
    start Adam afresh, its first steps a jolt of the full learning rate on every weight."""

    steps: int
    cursor: int
    params: np.ndarray
    best: Best | None = None
    optimizer: dict[str, np.ndarray] | None = None

    def frame(self) -> bytes:
        """What workers start from (a job checkpoint, `layouts.JobPosition`), the best snapshot beside it."""
        arrays = layouts.JobPosition(self.steps, self.cursor).checkpoint_arrays(self.params, self.optimizer)
        if self.best is not None:
            arrays |= layouts.best_arrays(self.best.step, self.best.loss, self.best.params)
        return encode(Tensors(sender=0, step=self.steps, arrays=arrays))

    @classmethod
    def read(cls, frame: bytes, like: np.ndarray) -> Checkpoint:
        """ValueError unless `frame` is a job checkpoint of a model shaped like `like`."""
        msg = decode(frame)
        if not isinstance(msg, Tensors):
            raise ValueError("not a checkpoint (Tensors frame)")
        params = layouts.check_params(msg.arrays, like)
        position = layouts.JobPosition.read(msg.arrays)
        best = layouts.read_best(msg.arrays, like)
        return cls(position.steps, position.cursor, params, None if best is None else Best(*best),
                   layouts.optimizer_state(msg.arrays) or None)


@dataclass
class Predecessor:
    """What the run before left a successor to continue from."""

    state: JobState
    checkpoint: Checkpoint | None
    rows: list[str]  # the run record's rows, from Redis, for a run directory that lost them
    in_redis: bool  # the state was in Redis: the earlier run's workers may still be there, unless it `ended`


@dataclass
class Resumed:
    """Where a successor continues the job: from `checkpoint` (the workers start from it), or from the start."""

    state: JobState
    checkpoint: Checkpoint | None
    takeovers: list[dict[str, Any]]  # each run after the first, this one last: where it continued from
    held: list[bytes]  # hellos of workers that started during the takeover, for the supervisor to take in


class Failover:
    """Saves the job's state as it runs, and finds it again for a successor."""

    def __init__(self, transport: Transport, run_dir: Path, job_id: str) -> None:
        self.transport = transport
        self.run_dir = run_dir
        self.job_id = job_id
        self._state_saved = -float("inf")
        self._checkpoint_due = 0.0  # monotonic time from which the next checkpoint may be written
        self._rows: list[str] = []  # rows of the newest block
        self._block = 0

    # ---- as the job runs ---------------------------------------------------------------------------

    def state_due(self) -> bool:
        return time.monotonic() - self._state_saved >= STATE_SECONDS

    def save_state(self, state: JobState) -> None:
        raw = state.to_json()
        self.transport.put(keys.job_rows(self._block), "".join(self._rows).encode())
        self.transport.put(keys.job_state(), raw)
        _write_atomically(self.run_dir / STATE_FILE, raw)
        self._state_saved = time.monotonic()

    def row(self, line: str) -> None:
        """One more line of metrics.jsonl (stored with the next state)."""
        if len(self._rows) == ROWS_PER_BLOCK:
            self.transport.put(keys.job_rows(self._block), "".join(self._rows).encode())
            self._rows, self._block = [], self._block + 1
        self._rows.append(line)

    def checkpoint_due(self) -> bool:
        return time.monotonic() >= self._checkpoint_due

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        started = time.monotonic()
        frame = checkpoint.frame()
        self.transport.put(keys.job_checkpoint(), frame)
        _write_atomically(self.run_dir / CHECKPOINT_FILE, frame)
        took = time.monotonic() - started
        self._checkpoint_due = time.monotonic() + max(CHECKPOINT_SECONDS, took / CHECKPOINT_SHARE)

    def keep(self, state: JobState, checkpoint: Checkpoint | None, in_redis: bool) -> None:
        """The job ended on a fault or a signal: the run directory keeps what `mlless train --resume` needs, and
        with `in_redis` Redis keeps it for a successor; without a newer `checkpoint`, the newest one written stays."""
        state = replace(state, ended=True)
        if in_redis:  # both places, as while the job ran
            if checkpoint is not None:
                self.save_checkpoint(checkpoint)
            self.save_state(state)
            return
        if checkpoint is not None:
            _write_atomically(self.run_dir / CHECKPOINT_FILE, checkpoint.frame())
        _write_atomically(self.run_dir / STATE_FILE, state.to_json())

    def discard(self) -> None:
        """The job ended with its model saved: nothing is left to resume (the transport's keys go with the job)."""
        for name in (STATE_FILE, CHECKPOINT_FILE):
            (self.run_dir / name).unlink(missing_ok=True)

    # ---- taking over -------------------------------------------------------------------------------

    def take_over(self, record: RunRecord, like: np.ndarray, decode_replica: Callable[[bytes], Tensors | None],
                  progress: Progress) -> Resumed | None:
        """Continue the job where an earlier run left it: a suspend, or a supervisor that died (None: it starts
        afresh, with a new `record`).

        Its surviving workers hand in their replicas; the job continues from them if they are newer than its
        checkpoint. Whatever else the earlier run left in Redis and RabbitMQ is cleared before workers start.
        """
        predecessor = self.load(like)
        if predecessor is None:
            record.start()
            return None
        state, checkpoint, held = predecessor.state, predecessor.checkpoint, []
        source = "start" if checkpoint is None else "checkpoint"
        if predecessor.in_redis:
            self.transport.reset()
        if predecessor.in_redis and not state.ended:  # its workers may have outlived it
            progress.message(f"job {self.job_id}: taking over from a supervisor that stopped at step "
                             f"{state.steps}; asking its workers for their replicas")
            survivors, held = self.harvest(decode_replica)
            ahead = survivors[0].step - state.run_step if survivors else 0
            # At least as new as the checkpoint: under rounds a kill just after a round's checkpoint finds the
            # replicas at that same step, and they are its model (the operator's failover e2e test took the
            # checkpoint then, by the timing of the kill).
            if survivors and (checkpoint is None or state.steps + ahead >= checkpoint.steps):
                params = layouts.model_of([t.arrays for t in survivors])
                # Replicas that share one optimizer state each hand it in (`Worker._publish_final_replica`): one does.
                checkpoint = Checkpoint(state.steps + ahead, state.cursor + ahead * state.live, params,
                                        None if checkpoint is None else checkpoint.best,
                                        layouts.optimizer_state(survivors[0].arrays) or None)
                source = f"replicas of {len(survivors)} surviving workers"
        steps = 0 if checkpoint is None else checkpoint.steps
        if checkpoint is not None:
            self.transport.put(keys.job_checkpoint(), checkpoint.frame())  # what the workers start from
        run = len(state.takeovers) + 2  # the first run, every takeover since, and this one
        takeovers = state.takeovers + [{"run": run, "step": steps, "from": source}]
        self.continue_rows(record.continue_after(steps, predecessor.rows))
        progress.message(f"job {self.job_id}: run {run} continues at step {steps}, from the {source}")
        return Resumed(state, checkpoint, takeovers, held)

    def load(self, like: np.ndarray) -> Predecessor | None:
        """The newest state of this job in Redis or the run directory (None: the job starts afresh)."""
        stored = self.transport.get_many([keys.job_state(), keys.job_checkpoint()])
        found = [(_parse_state(stored[0], f"the job state in Redis ({keys.job_state()})"), stored[1], True)]
        if (self.run_dir / STATE_FILE).exists():
            local = _parse_state(_read(self.run_dir / STATE_FILE), str(self.run_dir / STATE_FILE))
            frame = _read(self.run_dir / CHECKPOINT_FILE) if (self.run_dir / CHECKPOINT_FILE).exists() else None
            found.append((local, frame, False))
        found = [(s, f, r) for s, f, r in found if s is not None and s.job_id == self.job_id]
        if not found:
            # A suspended job keeps only its checkpoint: it resumes from it, its workers all ended.
            return None if stored[1] is None else Predecessor(JobState(self.job_id), self._read_checkpoint(stored[1], like), [], False)
        state, frame, in_redis = max(found, key=lambda sfr: sfr[0].steps)
        checkpoint = None if frame is None else self._read_checkpoint(frame, like)
        return Predecessor(state, checkpoint, self._stored_rows(state.rows), in_redis)

    def _read_checkpoint(self, frame: bytes, like: np.ndarray) -> Checkpoint | None:
        try:
            return Checkpoint.read(frame, like)
        except (FrameError, ValueError) as exc:
            log.error("job %s: ignoring a malformed model checkpoint: %s", self.job_id, exc)
            return None

    def continue_rows(self, lines: list[str]) -> None:
        """Store the rows the job keeps again (a successor's reset cleared Redis), and continue after them."""
        self._rows, self._block = [], 0
        for line in lines:
            self.row(line)

    def _stored_rows(self, n: int) -> list[str]:
        blocks = self.transport.get_many([keys.job_rows(b) for b in range((n + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK)])
        rows = [line + "\n" for block in blocks if block for line in block.decode(errors="replace").splitlines()]
        return rows[:n]

    def harvest(self, decode_replica: Callable[[bytes], Tensors | None], patience: float = HARVEST_SECONDS,
                ) -> tuple[list[Tensors], list[bytes]]:
        """Tell the previous run's workers that this supervisor took over (after `Transport.reset`): the surviving
        ones hand in their replicas, and those of the newest step are returned. So are the hellos of workers that
        have started since, for the supervisor to take in once it starts its own."""
        self.transport.broadcast(encode(Takeover(sender=SUPERVISOR, step=0)))
        deadline = time.monotonic() + patience
        done: dict[int, int] = {}
        hellos = []
        while time.monotonic() < deadline:
            body = self.transport.receive(timeout=0.2)
            if body is None:
                continue
            try:
                msg = decode(body)
            except FrameError:
                continue
            if isinstance(msg, Done):
                done[msg.sender] = msg.step
                deadline = time.monotonic() + HARVEST_QUIET_SECONDS
            elif isinstance(msg, Hello):
                hellos.append(body)
        ranks = sorted(done)
        frames = self.transport.get_many([keys.final_replica(r) for r in ranks])
        replicas = [t for t in (decode_replica(f) for f in frames if f is not None) if t is not None]
        newest = max((t.step for t in replicas), default=None)
        return [t for t in replicas if t.step == newest], hellos


def _parse_state(raw: bytes | None, source: str) -> JobState | None:
    if raw is None:
        return None
    try:
        return JobState.from_json(raw)
    except ValueError as exc:
        raise ResumeError(f"{source}: not a job state: {exc}") from None


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ResumeError(f"{path}: {exc.strerror}") from None


def _write_atomically(path: Path, data: bytes) -> None:
    """A crash mid-write leaves the previous file, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)

