"""Replica: the training step the worker runs, exchanged between replicas as workers exchange it."""
from __future__ import annotations

import numpy as np
import pytest

from mlless.data.batches import RatingsBatch
from mlless.training.models import build_model
from mlless.protocol.layouts import PARAMS
from mlless.spec.config import ModelConfig, default_optimizer
from mlless.training.replica import Replica, TrainingDiverged

DIMS = {"n_users": 40, "n_items": 30, "mean_rating": 3.0}


def replicas(n, v, optimizer=None):
    return [Replica(build_model("pmf", DIMS, seed=5), optimizer or default_optimizer("pmf"), v) for _ in range(n)]


def batch(rng, n=50):
    return RatingsBatch(rng.integers(0, 40, n).astype(np.int32), rng.integers(0, 30, n).astype(np.int32),
                        rng.uniform(1, 5, n).astype(np.float32))


def exchange(group, rng, t):
    """One step of every replica, then each applies the others' selections (a BSP/ISP step without the wire)."""
    results = [r.step(batch(rng), 1, t) for r in group]
    for w, replica in enumerate(group):
        for src, result in enumerate(results):
            if src != w:
                replica.apply(result.indices, result.values)
    return results


def test_bsp_replicas_stay_identical():
    rng = np.random.default_rng(0)
    group = replicas(3, v=0.0)
    for t in range(1, 30):
        exchange(group, rng, t)
        assert all(r.pending_count() == 0 for r in group)
        for r in group[1:]:
            np.testing.assert_allclose(r.params, group[0].params, rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(group[0].params))


def test_isp_replicas_differ_only_by_their_own_pending_updates():
    """Conservation: replica − pending is the same shared state on every worker, whatever was held back."""
    rng = np.random.default_rng(1)
    group = replicas(3, v=0.7)
    held_back = 0
    for t in range(1, 60):
        results = exchange(group, rng, t)
        held_back += sum(r.pending_count() for r in group)
        shared = []
        for r in group:
            idx, val = r.filter.pending()
            s = r.params.astype(np.float64)
            s[idx] -= val
            shared.append(s)
        for s in shared[1:]:
            np.testing.assert_allclose(s, shared[0], rtol=1e-4, atol=1e-5)
        assert all(len(res.indices) == len(np.unique(res.indices)) for res in results)
    assert held_back > 0  # the filter did hold updates back, so the check above is not BSP's in disguise


def trained(rng, steps):
    """A replica after ``steps`` ISP steps, and a fresh one of the same job."""
    replica, fresh = replicas(2, v=0.7)
    for t in range(1, steps + 1):
        replica.step(batch(rng), 1, t)
    return replica, fresh


def test_a_restored_replica_continues_exactly_like_the_original():
    rng = np.random.default_rng(2)
    original, copy = trained(rng, 19)
    copy.restore({k: v.copy() for k, v in original.snapshot(optimizer=True).items()})
    b = batch(rng)
    a, c = original.step(b, 1, 20), copy.step(b, 1, 20)
    np.testing.assert_array_equal(copy.params, original.params)
    np.testing.assert_array_equal(np.sort(a.indices), np.sort(c.indices))
    assert a.loss_sum == c.loss_sum


def test_a_joiner_adopts_the_shared_state():
    donor, joiner = trained(np.random.default_rng(3), 9)
    snapshot = donor.snapshot()
    joiner.adopt_shared(snapshot)
    expected = snapshot[PARAMS].copy()
    np.subtract.at(expected, *donor.filter.pending())
    np.testing.assert_array_equal(joiner.params, expected)
    assert joiner.pending_count() == 0


def test_alone_a_replica_shares_nothing_and_keeps_no_accumulator():
    rng = np.random.default_rng(4)
    replica = replicas(1, v=0.7)[0]
    result = replica.step(batch(rng), 1, 1, share=False)
    assert len(result.indices) == 0 and replica.pending_count() == 0 and result.samples == 50


def test_a_diverging_step_is_reported_not_published():
    replica = replicas(1, 0.7, default_optimizer("pmf").replace(type="sgd", learning_rate=1e30))[0]
    with pytest.raises(TrainingDiverged, match="learningRate"):
        for t in range(1, 5):
            replica.step(batch(np.random.default_rng(t)), 1, t)


def test_a_diverging_decay_is_blamed_on_l2_not_the_learning_rate():
    model = build_model("pmf", DIMS, ModelConfig("pmf", l2=1e300), seed=5)
    replica = Replica(model, default_optimizer("pmf").replace(type="sgd"), 0.7)
    with pytest.raises(TrainingDiverged, match=r"; lower spec\.model\.l2 \(1e\+300 at learning rate .* overshoots"):
        for t in range(1, 5):
            replica.step(batch(np.random.default_rng(t)), 1, t)


def test_an_update_beyond_the_frame_bound_is_reported_as_divergence():
    """Finite, but more than a frame may carry: the sender stops with the advice, instead of its peers rejecting it."""
    replica = replicas(1, 0.0, default_optimizer("pmf").replace(type="sgd", learning_rate=1e7))[0]
    with pytest.raises(TrainingDiverged, match=r"^the update's values reach .*, beyond the bound of \+-1e\+06 at step 1; "
                                               r"lower spec.optimizer.learningRate$"):
        replica.step(batch(np.random.default_rng(1)), 1, 1)


def test_a_bad_peer_update_changes_nothing():
    replica = replicas(1, v=0.7)[0]
    before = replica.params.copy()
    with pytest.raises(ValueError, match="out of range"):
        replica.apply(np.array([0, replica.params.size], np.int32), np.ones(2, np.float32))
    np.testing.assert_array_equal(replica.params, before)
