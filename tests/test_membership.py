"""Worker states: the transition table admits the lifecycle the supervisor drives, and nothing else."""
from __future__ import annotations

import time

import pytest

from mlless.progress import Progress
from mlless.launch.launcher import ExternalLauncher
from mlless.runtime.supervisor.membership import (
    EXIT_GRACE_SECONDS, TRANSITIONS, IllegalTransition, Membership, WorkerRecord, WorkerState,
)


def test_lifecycles_are_legal_and_end_with_the_invocation():
    for path in ([WorkerState.LIVE, WorkerState.DONE], [WorkerState.LIVE, WorkerState.LEAVING, WorkerState.LEFT],
                 [WorkerState.LIVE, WorkerState.DROPPED]):
        w = WorkerRecord(0, started=0.0)
        for state in path:
            w.move(state)
        assert w.state == path[-1] and w.seconds is not None
    joiner = WorkerRecord(1, started=0.0, state=WorkerState.JOINING)
    joiner.move(WorkerState.READY)
    joiner.move(WorkerState.LIVE)
    assert joiner.seconds is None


def test_final_states_lead_nowhere_and_illegal_moves_raise():
    assert all(not TRANSITIONS[s] for s in (WorkerState.DONE, WorkerState.LEFT, WorkerState.DROPPED))
    w = WorkerRecord(0, started=0.0, state=WorkerState.JOINING)
    with pytest.raises(IllegalTransition):
        w.move(WorkerState.LIVE)  # a joiner is admitted only once it is ready
    w.move(WorkerState.DROPPED)
    with pytest.raises(IllegalTransition):
        w.move(WorkerState.DONE)
    assert w.state == "dropped"  # states compare equal to the names in the run record


def test_a_worker_is_billed_the_start_up_its_launcher_spent_for_it_before_the_launch():
    """A zygote's start is billed to the first worker forked from it (`Launcher.start` returns its seconds)."""
    class Warm(ExternalLauncher):
        def start(self, rank: int) -> float:
            return 2.5 if rank == 0 else 0.0

    members = Membership(Warm(), Progress(enabled=False))
    first, second = members.start(0), members.start(1)
    now = time.monotonic()
    assert 2.5 <= first.invocation_seconds(now) < 3.0 and second.invocation_seconds(now) < 0.5


def test_an_exit_counts_only_once_what_the_worker_sent_before_it_is_read():
    """A worker sends Done and exits at once; its exit, seen first, must not drop it as if it had ended without one."""

    class Ended(ExternalLauncher):
        def exited(self) -> list[int]:
            return [0, 1]

    members = Membership(Ended(), Progress(enabled=False))
    done, crashed = members.add(0, WorkerState.LIVE), members.add(1, WorkerState.LIVE)
    received = []

    def receive(within: float) -> None:  # the Done of worker 0 comes in; worker 1 sent nothing
        received.append(within)
        if len(received) == 1:
            members.done(done)
        time.sleep(min(within, 0.05))

    started = time.monotonic()
    assert members.ended(receive) == [0, 1]
    assert done.state == WorkerState.DONE and crashed.state == WorkerState.LIVE  # the caller drops worker 1 only
    assert EXIT_GRACE_SECONDS <= time.monotonic() - started < EXIT_GRACE_SECONDS + 0.3  # worker 1's grace, no more
    assert members.ended(receive) == [1] and done.state == WorkerState.DONE  # an ended record is never reported again
