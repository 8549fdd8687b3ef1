"""Worker states: the transition table admits the lifecycle the supervisor drives, and nothing else."""
from __future__ import annotations

import pytest

from mlless.runtime.supervisor.membership import TRANSITIONS, IllegalTransition, WorkerRecord, WorkerState


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
