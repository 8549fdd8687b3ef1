"""The pure parts of the forecast suite (benchmarks/forecast.py): how an ETA's error, its band and the reference
that knew the other seeds are read from statuses and curves, and where the replayed stop rule stops. No runs, no
timings asserted (the benchmarks' business)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

# The benchmarks are a package at the repository's root (`python -m benchmarks`).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import forecast  # noqa: E402
from mlless.stopping.forecast import project_stop  # noqa: E402
from mlless.smoothing import RecentEwma  # noqa: E402
from mlless.stopping.rules import SMOOTHING_SPAN  # noqa: E402
from mlless.spec.config import StopConfig  # noqa: E402

#: (second, status.json) as the watcher sees them; the job's final status appears at 10.0 s.
SEEN = [
    (1.0, {"progress": 0.1, "etaSeconds": 60.0, "progressLimit": "maxEpochs"}),
    (4.0, {"progress": 0.55, "etaSeconds": 5.0, "etaLowSeconds": 4.0, "etaHighSeconds": 7.0,
           "progressLimit": "patience"}),
    (7.0, {"progress": 0.8, "etaSeconds": 2.0, "etaLowSeconds": 1.0, "etaHighSeconds": 2.5,
           "progressLimit": "patience"}),
    (10.0, {"progress": 1.0, "etaSeconds": 0.0, "modelURI": "file:///model.npz"}),
]


def test_the_error_at_a_mark_is_read_from_the_first_status_at_or_past_it():
    found = forecast.eta_errors(SEEN, 10.0)
    assert found[0.25] == found[0.5] == (pytest.approx((5.0 - 6.0) / 6.0), "patience")  # 4 s: 6 s were left
    assert found[0.75] == (pytest.approx((2.0 - 3.0) / 3.0), "patience")


def test_the_band_at_half_way_is_read_against_the_time_left():
    low, high = forecast.band_at_half(SEEN, 10.0)
    assert (low, high) == (pytest.approx(-2 / 6), pytest.approx(1 / 6))  # 4-7 s against 6 s left: it held
    assert forecast.band_at_half(SEEN, 12.0) == (pytest.approx(-4 / 8), pytest.approx(-1 / 8))  # it ended later: missed
    assert forecast.band_at_half([SEEN[0], SEEN[-1]], 10.0) is None  # no status at 50 %


def test_the_steadiness_counts_projections_past_twice_the_end():
    mean_log, past, counted = forecast.eta_steadiness(SEEN, 10.0)
    assert (past, counted) == (1, 3)  # the first status projected 61 s
    assert mean_log == pytest.approx(np.mean(np.abs(np.log([61 / 10, 9 / 10, 9 / 10]))))


def test_the_other_seeds_reference_is_asked_at_half_their_end_or_at_a_given_second():
    ends = [10.0, 12.0, 14.0]
    assert forecast.other_seeds_error(ends, 0) == pytest.approx((13.0 - 10.0) / (10.0 - 6.5))  # asked at 6.5 s
    assert forecast.other_seeds_error(ends, 0, at=8.0) == pytest.approx((13.0 - 10.0) / 2.0)
    assert forecast.other_seeds_error(ends, 0, at=11.0) is None  # the run had ended
    assert forecast.other_seeds_error([10.0], 0) is None


def test_the_replay_stops_where_the_rule_does_by_hand_and_reads_the_projections_band():
    stop = StopConfig(patience=3, min_delta=0.001)
    rng = np.random.default_rng(0)
    losses = 0.58 + 0.4 * np.exp(-np.arange(1, 41) / 4) + rng.normal(0, 0.001, 40)
    curve = [(25 * (k + 1), 0.1 * (k + 1), float(x)) for k, x in enumerate(losses)]  # (step, second, loss)
    # the rule by hand: a smoothed loss below its best by more than minDelta resets the count
    best, stale, by_hand = float("inf"), 0, None
    window = RecentEwma(SMOOTHING_SPAN)
    for step, _, loss in curve:
        smoothed = window.update(loss)
        best, stale = (smoothed, 0) if smoothed < best * (1 - stop.min_delta) else (best, stale + 1)
        if stale >= stop.patience:
            by_hand = step
            break
    end = forecast.real_stop(curve, stop)
    assert end is not None and end == by_hand
    seen = [(s, x) for s, _, x in curve if s < end]
    fitted = project_stop([s for s, _ in seen], [x for _, x in seen], stop, 25)
    assert fitted is not None and fitted.band is not None and fitted.band[0] <= fitted.step <= fitted.band[1]
    held, close = forecast.futures_at_half(curve, 25, stop)
    assert isinstance(held, bool) and 0.0 < close <= 1.0  # the median is within 20 % of itself at the least
