"""ISP significance filter: exact sent values, thresholds, the x = 0 guard, and equivalence with a full walk."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mlless.training.significance import SignificanceFilter


def accumulator(f: SignificanceFilter) -> np.ndarray:
    """The filter's δ, as its timing wheel holds it."""
    return f._wheel.slots["acc"]


def _sorted(selection):
    idx, val = selection
    order = np.argsort(idx)
    return idx[order], val[order]


def test_threshold_zero_sends_every_nonzero_entry_bsp():
    x = np.full(10, 100.0, np.float32)
    f = SignificanceFilter(x, 0.0)
    f.accumulate(np.array([1, 4, 4, 7], np.int32), np.array([0.5, 1e-9, 2e-9, -3.0], np.float32))
    f.accumulate(np.array([2], np.int32), np.array([0.0], np.float32))  # a zero update is never sent
    idx, val = _sorted(f.select(1))
    np.testing.assert_array_equal(idx, [1, 4, 7])
    np.testing.assert_array_equal(val, np.array([0.5, np.float32(1e-9) + np.float32(2e-9), -3.0], np.float32))
    assert f.pending_count() == 0 and not accumulator(f).any()


def test_positive_threshold_sends_only_significant_entries():
    x = np.array([1.0, 1.0, 10.0, -2.0], np.float32)
    f = SignificanceFilter(x, 0.1)
    f.accumulate(np.arange(4, dtype=np.int32), np.array([0.5, 0.04, 0.4, -1.5], np.float32))
    idx, val = f.select(1)  # ratios 0.5, 0.04, 0.04, 0.75 against v_1 = 0.1
    assert dict(zip(idx.tolist(), val.tolist())) == {0: 0.5, 3: -1.5}
    np.testing.assert_array_equal(accumulator(f), np.array([0, 0.04, 0.4, 0], np.float32))
    assert f.pending_count() == 2
    # v_t = 0.1/√t falls below 0.04 after t = 6.25: the two waiting entries go at step 7, untouched since.
    for t in range(2, 7):
        assert f.select(t)[0].size == 0
    assert sorted(f.select(7)[0].tolist()) == [1, 2]


def test_a_peer_update_to_x_changes_when_an_entry_is_due():
    x = np.array([1.0], np.float32)
    f = SignificanceFilter(x, 0.5)
    f.accumulate(np.array([0], np.int32), np.array([0.1], np.float32))  # due after t = 25
    assert f.select(1)[0].size == 0
    x[0] = 0.25  # a peer moved x; the filter hears of it
    f.touched(np.array([0], np.int32))
    assert f.select(2)[0].tolist() == [0]  # 0.1 > 0.5/√2 · 0.25


def test_fresh_weight_guard():
    x = np.array([0.0, 1.0, 0.0], np.float32)
    f = SignificanceFilter(x, 1e6)
    f.accumulate(np.array([0, 1], np.int32), np.array([1e-12, 1e-12], np.float32))
    idx, val = f.select(1)  # x_0 = 0 is always significant
    assert idx.tolist() == [0] and val.tolist() == [np.float32(1e-12)]


def test_pending_and_restore_roundtrip():
    x = np.ones(6, np.float32)
    f = SignificanceFilter(x, 10.0)
    f.accumulate(np.array([5, 2, 2], np.int32), np.array([1.0, 2.0, 3.0], np.float32))
    g = SignificanceFilter(x, 10.0)
    g.restore(*f.pending())
    for flt in (f, g):
        idx, val = flt.pending()
        assert dict(zip(idx.tolist(), val.tolist())) == {2: 5.0, 5: 1.0} and flt.pending_count() == 2
        assert flt.select(50)[0].tolist() == [2]  # 5 > 10/√50 · 1, and 1 is not
        assert flt.pending_count() == 1


def test_bad_inputs():
    x = np.zeros(3, np.float32)
    f = SignificanceFilter(x, 0.7)
    with pytest.raises(IndexError):
        f.accumulate(np.array([3], np.int32), np.array([1.0], np.float32))
    assert not accumulator(f).any()  # all or nothing
    f.accumulate(np.array([1], np.int32), np.array([1.0], np.float32))
    with pytest.raises(IndexError):
        f.touched(np.array([-1], np.int32))
    with pytest.raises(ValueError):
        f.select(0)
    with pytest.raises(ValueError):
        SignificanceFilter(x, -1.0)
    with pytest.raises(ValueError):
        SignificanceFilter(np.zeros(3), 0.7)
    # v_t = v / sqrt(t): at t = 4, v = 0.7 sends |δ| > 0.35·|x| and keeps the rest.
    g = SignificanceFilter(np.ones(2, np.float32), 0.7)
    g.accumulate(np.array([0, 1], np.int32), np.array([0.36, 0.34], np.float32))
    assert g.select(4)[0].tolist() == [0]


class WalkingFilter:
    """The reference: every pending entry checked at every step (the filter before the timing wheel)."""

    def __init__(self, size: int, v: float) -> None:
        self.acc = np.zeros(size, np.float32)
        self.v = v

    def accumulate(self, idx, delta):
        np.add.at(self.acc, idx, delta)  # float32, in order: the same sums as the kernel's

    def select(self, x, t):
        threshold = self.v / math.sqrt(t)
        pending = np.flatnonzero(self.acc)
        d, xi = self.acc[pending], x[pending]
        significant = (threshold == 0) | (xi == 0) | (np.abs(d.astype(np.float64)) > threshold * np.abs(xi.astype(np.float64)))
        idx = pending[significant].astype(np.int32)
        values = self.acc[idx].copy()
        self.acc[idx] = 0
        return idx, values


@pytest.mark.parametrize("seed, v, bits", [(0, 0.7, 6), (1, 0.7, 1), (2, 3.0, 2), (3, 0.0, 3), (4, 0.05, 2),
                                           (5, 0.7, 4), (6, 3.0, 1)])
def test_the_timing_wheel_selects_exactly_what_a_full_walk_selects(seed, v, bits):
    """Long random sequences of own updates, peers' updates, cancellations, zeros, gaps and restores.

    Narrow wheels (1-3 bits per level) make entries fall through many levels
    and blocks turn over every few steps; every selection and the accumulator
    are compared bit for bit after every step.
    """
    rng = np.random.default_rng(seed)
    size = 1500
    # Magnitudes spread over decades put due steps from "now" to far past the run.
    x = (rng.lognormal(0, 1.5, size) * rng.choice([-1, 1], size)).astype(np.float32)
    x[rng.choice(size, 20, replace=False)] = 0
    wheel, walk = SignificanceFilter(x, v, bits), WalkingFilter(size, v)
    hot = rng.zipf(1.3, 200_000) % size  # skewed ids, as in real data
    t = 0
    for step in range(6000):
        t += 1
        own = hot[rng.integers(0, len(hot), rng.integers(0, 40))].astype(np.int32)  # repeats allowed
        delta = (rng.normal(0, 1, len(own)) * 10.0 ** rng.uniform(-5, -1, len(own))).astype(np.float32)
        if step % 97 == 0 and len(own):
            own, delta = np.concatenate([own, own[:1]]), np.concatenate([delta, -delta[:1]])  # δ back to exactly 0
        np.add.at(x, own, delta)
        wheel.accumulate(own, delta)
        walk.accumulate(own, delta)
        if step % 5 == 0:  # a peer's update: x moves, δ does not
            peer = np.unique(hot[rng.integers(0, len(hot), 30)]).astype(np.int32)
            x[peer] += (rng.normal(0, 1, len(peer)) * 10.0 ** rng.uniform(-4, 0, len(peer))).astype(np.float32)
            if step % 50 == 0:
                x[peer[:2]] = 0
            wheel.touched(peer)
        if step % 1500 == 1499:
            t += 7  # steps without a selection (a worker that was alone for a while)
        if step % 2000 == 1999:
            restored = SignificanceFilter(x, v, bits)
            restored.restore(*wheel.pending())
            wheel = restored
        got, want = _sorted(wheel.select(t)), walk.select(x, t)
        np.testing.assert_array_equal(got[0], want[0], err_msg=f"indices at step {t}")
        np.testing.assert_array_equal(got[1], want[1], err_msg=f"values at step {t}")
        np.testing.assert_array_equal(accumulator(wheel), walk.acc)
        assert wheel.pending_count() == np.count_nonzero(walk.acc)
        assert wheel._wheel.n_copies <= max(4 * wheel.pending_count(), 1 << 16) + 2000  # stale copies are bounded


def test_entries_exactly_at_the_threshold_are_sent_at_the_first_step_the_exact_test_passes():
    """|δ| = |x|/k with v = 1 puts the real crossing exactly at t = k²; rounding decides either side of it."""
    k = np.arange(2, 61)
    d = np.float32(0.125)
    x = (k * d).astype(np.float32)
    wheel, walk = SignificanceFilter(x, 1.0), WalkingFilter(len(k), 1.0)
    idx = np.arange(len(k), dtype=np.int32)
    wheel.accumulate(idx, np.full(len(k), d, np.float32))
    walk.accumulate(idx, np.full(len(k), d, np.float32))
    for t in range(1, 61 * 61):
        got, want = _sorted(wheel.select(t)), walk.select(x, t)
        np.testing.assert_array_equal(got[0], want[0], err_msg=f"step {t}")
    assert wheel.pending_count() == 0


@pytest.mark.parametrize("v", [0.0, 0.7])
def test_step_is_accumulate_then_select(v):
    """`step` (with BSP's shortcut at v = 0) selects what accumulate + select would, zero updates left out."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=300).astype(np.float32)
    y = x.copy()
    fast, slow = SignificanceFilter(x, v), SignificanceFilter(y, v)
    for t in range(1, 200):
        idx = rng.choice(300, 40, replace=False).astype(np.int32)
        delta = (rng.normal(size=40) * 0.01).astype(np.float32)
        delta[:3] = 0
        x[idx] += delta
        y[idx] += delta
        slow.accumulate(idx, delta)
        got, want = _sorted(fast.step(idx, delta, t)), _sorted(slow.select(t))
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        assert 0 not in got[1]
