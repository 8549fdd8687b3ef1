"""Causal EWMA filter: a smoothing that never revises a value once it is seen.

The auto-tuner smooths losses with it, the stop rules validation losses (stopping/rules.py), and
the supervisor and workers their step and evaluation times; it sits at the package's root so that none of
them loads another part (or scipy) for it.

The original code smoothed forward and then backward over the whole history at every check. We use a
**causal** EWMA (the smoothed value at step t depends only on losses up to t), for both of the auto-tuner's jobs:

* knee detection: a knee that has been accepted must never be revised by data that arrives later; with a
  forward+backward filter the past keeps moving, which is why the original needed "stable for 5 checks";
* curve fitting: measured on synthetic SGD-like curves (tests/test_autotuner.py), fitting the causal EWMA
  extrapolates better 50–200 steps ahead than the forward+backward one. The zero-phase filter is lag-free in
  the interior but still lagged at the window's end, which leaves a kink exactly where the fit's weights
  (σ_i = 1/i) are largest; a uniformly lagged curve keeps its shape.

Bias-corrected ("adjust=True", as pandas) weighting, so the first values are not dragged towards zero or
towards the first sample.

`RecentEwma` is the same weighting over a finite window of the newest values: the stop rules' smoothed
validation loss, where an early evaluation far above the rest (the warm-up) must drop out rather than fade.
"""

from __future__ import annotations

import collections

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["OnlineEwma", "RecentEwma", "alpha_from_span", "ewma"]


def alpha_from_span(span: float) -> float:
    """The smoothing factor α = 2/(span+1) (pandas' definition of span)."""
    if span < 1:
        raise ValueError(f"EWMA span must be >= 1, got {span}")
    return 2.0 / (float(span) + 1.0)


class OnlineEwma:
    """Causal, bias-corrected EWMA updated one sample at a time (O(1) per step)."""

    __slots__ = ("_decay", "_num", "_den", "value")

    def __init__(self, span: float) -> None:
        self._decay = 1.0 - alpha_from_span(span)
        self._num = 0.0
        self._den = 0.0
        self.value: float | None = None

    def update(self, x: float) -> float:
        self._num = self._decay * self._num + x
        self._den = self._decay * self._den + 1.0
        self.value = self._num / self._den
        return self.value


class RecentEwma:
    """Causal, bias-corrected EWMA of the newest `window` values only (default: `span` of them); older ones drop out."""

    __slots__ = ("_weights", "_sums", "_recent", "value")

    def __init__(self, span: float, window: int | None = None) -> None:
        window = int(span) if window is None else window
        if window < 1:
            raise ValueError(f"EWMA window must be >= 1, got {window}")
        # Plain floats, not arrays: the window is a few values, updated one evaluation at a time, where numpy's
        # per-call cost was most of an update's (`following` is the vectorised path, for many values at once).
        self._weights = tuple(float(w) for w in (1.0 - alpha_from_span(span)) ** np.arange(window))
        self._sums = tuple(float(s) for s in np.cumsum(self._weights))
        self._recent: collections.deque[float] = collections.deque(maxlen=window)  # newest first
        self.value: float | None = None

    def update(self, x: float) -> float:
        self._recent.appendleft(float(x))
        self.value = sum(w * v for w, v in zip(self._weights, self._recent)) / self._sums[len(self._recent) - 1]
        return self.value

    def following(self, values: ArrayLike) -> NDArray[np.float64]:
        """What `update` would return for each value of a row of `values` in turn, every row going on from the
        window as it stands, which is left as it was: the ETA smooths its thirty-one projected futures of a fit at
        once (stopping/forecast.py). The same sums in the same order as `update`'s, so the same floats."""
        rows = np.asarray(values, dtype=np.float64)
        older = np.array(self._recent, dtype=np.float64)[::-1]  # oldest first
        held = np.concatenate([np.broadcast_to(older, rows.shape[:-1] + older.shape), rows], axis=-1)
        start, width = older.size, rows.shape[-1]
        out = np.zeros_like(rows)
        for j, weight in enumerate(self._weights):  # the j-th newest value of each window
            first = max(0, j - start)  # the first row value whose window reaches back j values
            if first < width:
                out[..., first:] += weight * held[..., start + first - j:start + width - j]
        kept = np.minimum(np.arange(start + 1, start + width + 1), len(self._weights))
        return out / np.asarray(self._sums)[kept - 1]


def ewma(x: ArrayLike, span: float) -> NDArray[np.float64]:
    """Causal bias-corrected EWMA of a 1-D array (same values as ``pandas.Series.ewm(span).mean()``)."""
    arr = np.asarray(x, dtype=np.float64)
    out = np.empty_like(arr)
    f = OnlineEwma(span)
    for i, v in enumerate(arr):
        out[i] = f.update(float(v))
    return out

