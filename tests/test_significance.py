"""ISP significance filter: exact sent values, thresholds, the x = 0 guard, drain."""
from __future__ import annotations

import numpy as np
import pytest

from mlless.significance import SignificanceFilter, isp_threshold


def test_threshold_zero_sends_every_nonzero_entry_bsp():
    f = SignificanceFilter(10)
    f.accumulate(np.array([1, 4, 4, 7], np.int32), np.array([0.5, 1e-9, 2e-9, -3.0], np.float32))
    f.accumulate(np.array([2], np.int32), np.array([0.0], np.float32))  # a zero update is never sent
    x = np.full(10, 100.0, np.float32)
    idx, val = f.select(x, 0.0)
    order = np.argsort(idx)
    np.testing.assert_array_equal(idx[order], [1, 4, 7])
    np.testing.assert_array_equal(val[order], np.array([0.5, np.float32(1e-9) + np.float32(2e-9), -3.0], np.float32))
    assert f.pending_count() == 0 and not f.accumulator.any()


def test_positive_threshold_sends_only_significant_entries():
    f = SignificanceFilter(4)
    x = np.array([1.0, 1.0, 10.0, -2.0], np.float32)
    f.accumulate(np.arange(4, dtype=np.int32), np.array([0.5, 0.05, 0.5, -1.5], np.float32))
    idx, val = f.select(x, 0.1)  # ratios 0.5, 0.05, 0.05, 0.75
    assert sorted(idx.tolist()) == [0, 3]
    assert dict(zip(idx.tolist(), val.tolist())) == {0: 0.5, 3: -1.5}
    np.testing.assert_array_equal(f.accumulator, np.array([0, 0.05, 0.5, 0], np.float32))
    assert f.pending_count() == 2


def test_sent_value_is_sum_since_last_sent():
    rng = np.random.default_rng(0)
    n = 50
    f = SignificanceFilter(n)
    x = rng.normal(size=n).astype(np.float32)
    pending = np.zeros(n, np.float32)  # float32 sums in the same order as the filter
    total_sent = np.zeros(n, np.float64)
    total_acc = np.zeros(n, np.float64)
    for t in range(1, 40):
        idx = np.unique(rng.integers(0, n, 12)).astype(np.int32)
        d = (rng.normal(size=len(idx)) * 0.05).astype(np.float32)
        x[idx] += d
        f.accumulate(idx, d)
        pending[idx] += d
        total_acc[idx] += d
        s_idx, s_val = f.select(x, isp_threshold(0.7, t))
        np.testing.assert_array_equal(s_val, pending[s_idx])  # bit-exact
        assert np.all(np.abs(s_val / x[s_idx]) > isp_threshold(0.7, t))
        total_sent[s_idx] += s_val
        pending[s_idx] = 0
        np.testing.assert_array_equal(f.accumulator, pending)
    d_idx, d_val = f.drain()
    total_sent[d_idx] += d_val
    np.testing.assert_allclose(total_sent, total_acc, atol=1e-5)  # nothing lost, nothing duplicated
    assert f.pending_count() == 0


def test_v_positive_sends_fewer_than_bsp():
    rng = np.random.default_rng(1)
    n = 1000
    x = rng.normal(size=n).astype(np.float32)
    idx = np.arange(n, dtype=np.int32)
    d = (rng.normal(size=n) * 0.01).astype(np.float32)
    bsp, isp = SignificanceFilter(n), SignificanceFilter(n)
    bsp.accumulate(idx, d)
    isp.accumulate(idx, d)
    assert len(bsp.select(x, 0.0)[0]) == n
    sent = len(isp.select(x, 0.05)[0])
    assert 0 < sent < n // 2


def test_fresh_weight_guard():
    f = SignificanceFilter(3)
    f.accumulate(np.array([0, 1], np.int32), np.array([1e-12, 1e-12], np.float32))
    idx, val = f.select(np.array([0.0, 1.0, 0.0], np.float32), 1e6)  # x_0 = 0 is always significant
    assert idx.tolist() == [0] and val.tolist() == [np.float32(1e-12)]


def test_drain_and_state_roundtrip():
    f = SignificanceFilter(6)
    f.accumulate(np.array([5, 2, 2], np.int32), np.array([1.0, 2.0, 3.0], np.float32))
    g = SignificanceFilter(6)
    g.load_state(f.state())
    for flt in (f, g):
        idx, val = flt.drain()
        assert dict(zip(idx.tolist(), val.tolist())) == {5: 1.0, 2: 5.0}
        assert flt.pending_count() == 0 and flt.drain()[0].size == 0


def test_bad_inputs():
    f = SignificanceFilter(3)
    with pytest.raises(IndexError):
        f.accumulate(np.array([3], np.int32), np.array([1.0], np.float32))
    with pytest.raises(ValueError):
        f.select(np.zeros(4, np.float32), 0.1)
    with pytest.raises(ValueError):
        f.select(np.zeros(3, np.float32), -1.0)
    with pytest.raises(ValueError):
        isp_threshold(0.7, 0)
    assert isp_threshold(0.7, 4) == pytest.approx(0.35)


def test_bsp_replicas_stay_identical_with_pmf_workers():
    """v = 0: after every exchange, all replicas agree (up to float summation order)."""
    from mlless.data.batches import RatingsBatch
    from mlless.models import build_model
    from mlless.optim import default_optimizer, make_optimizer

    rng = np.random.default_rng(0)
    dims = {"n_users": 40, "n_items": 30, "mean_rating": 3.0}
    workers = []
    for _ in range(3):
        m = build_model("pmf", dims, seed=5)
        cfg = default_optimizer("pmf")
        workers.append((m, make_optimizer(m.size, cfg, m.accumulator_size), SignificanceFilter(m.size)))
    for t in range(1, 15):
        sent = []
        for m, opt, flt in workers:
            n = 50
            b = RatingsBatch(rng.integers(0, 40, n).astype(np.int32), rng.integers(0, 30, n).astype(np.int32),
                             rng.uniform(1, 5, n).astype(np.float32))
            idx, delta, _, _ = opt.update(m, b, cfg.learning_rate)
            flt.accumulate(idx, delta)
            sent.append(flt.select(m.params, isp_threshold(0.0, t)))
            assert flt.pending_count() == 0
        for w, (m, _, _) in enumerate(workers):
            for src, (idx, val) in enumerate(sent):
                if src != w:
                    m.params[idx] += val
        assert np.all(np.isfinite(workers[0][0].params))
        for m, _, _ in workers[1:]:
            np.testing.assert_allclose(m.params, workers[0][0].params, rtol=1e-5, atol=1e-6)
