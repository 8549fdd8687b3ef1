"""Who is in the job: worker states and their legal transitions, starts, joins, leaves and drops.

A worker started with the job goes starting -> live once it says hello. A
scale-out worker goes joining -> ready on its hello, and ready -> live when
a step-close admits it. A live worker ends done (it published its final
replica), leaving -> left (evicted, it hands on its unsent updates), left
(it left on its own), or dropped (its process ended or it stalled).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Callable

from mlless.progress import Progress
from mlless.launch.launcher import Launcher

log = logging.getLogger(__name__)


class JobFailed(RuntimeError):
    """The job cannot continue (no live workers left, or nobody started)."""


class WorkerState(StrEnum):
    STARTING = "starting"
    JOINING = "joining"
    READY = "ready"
    LIVE = "live"
    LEAVING = "leaving"
    DONE = "done"
    LEFT = "left"
    DROPPED = "dropped"


#: Which states a worker may move to from each state; done, left and dropped are final.
TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    WorkerState.STARTING: frozenset({WorkerState.LIVE, WorkerState.DONE, WorkerState.DROPPED}),
    WorkerState.JOINING: frozenset({WorkerState.READY, WorkerState.DONE, WorkerState.DROPPED}),
    WorkerState.READY: frozenset({WorkerState.LIVE, WorkerState.DONE, WorkerState.DROPPED}),
    WorkerState.LIVE: frozenset({WorkerState.LEAVING, WorkerState.LEFT, WorkerState.DONE, WorkerState.DROPPED}),
    WorkerState.LEAVING: frozenset({WorkerState.LEFT, WorkerState.DONE, WorkerState.DROPPED}),
    WorkerState.DONE: frozenset(),
    WorkerState.LEFT: frozenset(),
    WorkerState.DROPPED: frozenset(),
}
#: Workers that count towards the desired size: in the barrier, or about to be.
ACTIVE = frozenset({WorkerState.LIVE, WorkerState.JOINING, WorkerState.READY})
#: Workers not billed yet: the supervisor has not heard from them, or they wait for admission.
UNBILLED = frozenset({WorkerState.STARTING, WorkerState.JOINING, WorkerState.READY})
#: A worker sends its last message (Done, Left) just before its process exits, and the exit can be seen first (a forked
#: worker ends within a millisecond of its last send): how long its message is waited for before the exit counts.
EXIT_GRACE_SECONDS = 0.5


class IllegalTransition(RuntimeError):
    """A worker was moved to a state its current state does not lead to."""


@dataclass
class WorkerRecord:
    rank: int
    started: float
    state: WorkerState = WorkerState.STARTING
    seconds: float | None = None  # invocation length once it has ended

    @property
    def ended_already(self) -> bool:
        return not TRANSITIONS[self.state]

    def move(self, to: WorkerState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"worker {self.rank}: {self.state} -> {to}")
        self.state = to
        if self.ended_already:
            self.ended(time.monotonic())

    def ended(self, now: float) -> None:
        if self.seconds is None:
            self.seconds = now - self.started

    def invocation_seconds(self, now: float) -> float:
        return self.seconds if self.seconds is not None else now - self.started


class Membership:
    """The job's worker records; starts and stops their processes through the launcher."""

    def __init__(self, launcher: Launcher, progress: Progress) -> None:
        self.launcher = launcher
        self.progress = progress
        self.workers: dict[int, WorkerRecord] = {}
        self.dropped: list[dict[str, Any]] = []

    @property
    def live(self) -> tuple[int, ...]:
        return tuple(sorted(r for r, w in self.workers.items() if w.state == WorkerState.LIVE))

    def active(self) -> int:
        return sum(w.state in ACTIVE for w in self.workers.values())

    def all_started(self) -> bool:
        return all(w.state != WorkerState.STARTING for w in self.workers.values())

    def start(self, rank: int, state: WorkerState = WorkerState.STARTING) -> WorkerRecord:
        """Record `rank` and launch its process, billed from its launch (or earlier, or later: `Launcher.start`)."""
        worker = self.add(rank, state)
        worker.started -= self.launcher.start(rank)
        return worker

    def add(self, rank: int, state: WorkerState) -> WorkerRecord:
        """Record `rank`, whose process was started (by the launcher or the platform)."""
        worker = self.workers[rank] = WorkerRecord(rank, time.monotonic(), state=state)
        return worker

    def said_hello(self, worker: WorkerRecord) -> None:
        if worker.state == WorkerState.STARTING:
            worker.move(WorkerState.LIVE)
        elif worker.state == WorkerState.JOINING:
            worker.move(WorkerState.READY)

    def done(self, worker: WorkerRecord) -> None:
        """It published its final replica and returns. Billing runs from invocation to return as the platform
        sees it, cold start included, so the supervisor's clock counts, not the worker's own report of it."""
        if not worker.ended_already:  # a worker dropped for stalling may still finish
            worker.move(WorkerState.DONE)

    def admit_ready(self) -> list[WorkerRecord]:
        """Every joiner that is ready becomes live."""
        ready = [w for w in self.workers.values() if w.state == WorkerState.READY]
        for w in ready:
            w.move(WorkerState.LIVE)
        return ready

    def drop(self, rank: int, step: int, why: str) -> bool:
        """Take `rank` out and stop its process; False if it had already ended."""
        worker = self.workers[rank]
        if worker.ended_already:
            return False
        worker.move(WorkerState.DROPPED)
        self.dropped.append({"rank": rank, "step": step, "reason": why})
        self.progress.message(f"worker {rank} dropped at step {step}: {why}")
        log.warning("worker %d dropped at step %d: %s", rank, step, why)
        self.launcher.stop(rank)
        return True

    def ended(self, receive: Callable[[float], None]) -> list[int]:
        """Ranks whose process ended while their record had not; `receive` (handle a message, waiting up to the seconds
        given) runs first until their last messages are in, for EXIT_GRACE_SECONDS at most."""
        ended = [rank for rank in self.launcher.exited() if not self.workers[rank].ended_already]
        deadline = time.monotonic() + EXIT_GRACE_SECONDS
        while any(not self.workers[r].ended_already for r in ended) and (left := deadline - time.monotonic()) > 0:
            receive(left)
        return ended

    def invocation_seconds(self, now: float) -> list[float]:
        return [w.invocation_seconds(now) for w in self.workers.values()]
