"""The round accumulator (training/rounds.py): a replica under model averaging or blocked keeps δ = x − shared,
and selects, at a round's end, exactly what the significance filter at v = 0 would."""
from __future__ import annotations

import numpy as np

from mlless.protocol import layouts
from mlless.spec.config import default_optimizer
from mlless.training.models import build_model
from mlless.training.replica import Replica
from mlless.training.rounds import RoundAccumulator

from test_replica import DIMS, batch


def pair():
    """The same replica twice: with the significance filter at v = 0, and with the round accumulator."""
    models = [build_model("pmf", DIMS, seed=5) for _ in range(2)]
    return (Replica(models[0], default_optimizer("pmf"), 0.0),
            Replica(models[1], default_optimizer("pmf"), 0.0, accumulator=RoundAccumulator(models[1].params)))


def same(a, b):
    """The same entries (in any order: the filter's timing wheel selects in its own) and values."""
    (ai, av), (bi, bv) = [(idx[np.argsort(idx)], values[np.argsort(idx)]) for idx, values in (a, b)]
    assert np.array_equal(ai, bi) and np.allclose(av, bv, rtol=0, atol=1e-6)


def test_a_round_selects_what_the_filter_at_zero_selects_and_a_peers_update_stays_out():
    rng = np.random.default_rng(3)
    wheel, rounds = pair()
    for t in range(1, 13):
        b = batch(rng)
        results = [r.step(b, 1, t, select=t % 4 == 0) for r in (wheel, rounds)]
        same(*[(r.indices, r.values) for r in results])
        assert np.allclose(wheel.params, rounds.params, rtol=0, atol=1e-6)
        assert wheel.pending_count() <= rounds.pending_count()  # the round counts changed entries, an upper bound
        same(layouts.pending(wheel.snapshot()), layouts.pending(rounds.snapshot()))
        idx = np.unique(rng.integers(0, wheel.params.shape[0], 10)).astype(np.int32)
        for r in (wheel, rounds):
            r.apply(idx, np.full(len(idx), 0.01, np.float32))  # a peer's update is shared state, not pending
        same(layouts.pending(wheel.snapshot()), layouts.pending(rounds.snapshot()))


def test_unsent_entries_and_a_lone_workers_steps_and_a_restore():
    rng = np.random.default_rng(4)
    _, rounds = pair()
    rounds.step(batch(rng), 1, 1, share=False)  # alone: the move is the shared state's
    assert rounds.pending_count() == 0 and len(layouts.pending(rounds.snapshot())[0]) == 0
    selected = rounds.step(batch(rng), 1, 2)
    assert len(selected.indices) and rounds.pending_count() == 0
    rounds.unpublish(selected.indices, selected.values)  # nobody applied them: pending again
    same(layouts.pending(rounds.snapshot()), (selected.indices, selected.values))
    arrays = rounds.snapshot()
    _, fresh = pair()
    fresh.restore(arrays)
    same(layouts.pending(fresh.snapshot()), (selected.indices, selected.values))


def test_steps_alone_between_shared_ones_are_not_pending():
    rng = np.random.default_rng(5)
    wheel, rounds = pair()
    for share, select in [(True, False), (False, False), (False, False), (True, False), (False, False), (True, True)]:
        b = batch(rng)
        results = [r.step(b, 1, 1, share=share, select=select) for r in (wheel, rounds)]
        same(layouts.pending(wheel.snapshot()), layouts.pending(rounds.snapshot()))
    same(*[(r.indices, r.values) for r in results])


def test_held_entries_stay_pending_at_a_rounds_end_until_released():
    rng = np.random.default_rng(6)
    _, rounds = pair()
    held = np.zeros(rounds.params.shape[0], np.uint8)
    held[: DIMS["n_users"] * 4] = 1  # the first users' rows
    rounds.filter.hold(held)
    for t in range(1, 4):
        rounds.step(batch(rng), 1, t, select=False)
    pending = layouts.pending(rounds.snapshot())
    selected = rounds.step(batch(rng), 1, 4)
    assert len(selected.indices) and not held[selected.indices].any()  # the rest is published...
    left = layouts.pending(rounds.snapshot())
    assert len(left[0]) and held[left[0]].all() and set(pending[0][held[pending[0]] == 1]) <= set(left[0])  # ...these wait
    rounds.filter.hold(np.zeros_like(held))
    released = rounds.step(batch(rng), 1, 5)
    assert set(left[0]) <= set(released.indices) and rounds.pending_count() == 0
