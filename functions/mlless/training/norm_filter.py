"""SPIRT's significance filter for networks (SPIRT §VI.C.4): norm-isp's accumulator (sync/protocols/norm.py).

A worker accumulates its own updates since its last send t': after step k, δ_k is what it applied from t' to k
(the replica minus the shared state, as `RoundAccumulator` keeps it). After step t it sends δ_t whole once

    Σ_{k=t'..t} ‖δ_k‖ / ‖x_k‖ > threshold

with Euclidean norms over the whole model and x_k the replica after step k, and its sum starts again from 0. The
sum of relative norms, not the last one alone, decides: a worker whose updates stay small still sends after
enough steps, and one whose updates are large sends after one. Threshold 0 sends every step that changed
something, which is BSP.

Per layer (`spec.sync.normScope: layer`) each of the model's parameter groups (`Model.segments`: a network's
parameter tensors) keeps its own sum of ‖δ_k,s‖ / ‖x_k,s‖ and is sent when that sum passes; the other groups
stay pending (`RoundAccumulator.hold`). A group whose parameters are all 0 is sent as soon as it changes.

MLLess's per-entry filter (training/significance.py) suits sparse models, whose rows move one at a time; on a
network every weight moves every step, each against its own weight, and the entries that pass each step are a
scattered subset that travels with its indices listed (8 bytes an entry, twice a dense frame's).
"""
from __future__ import annotations

import math

import numpy as np

from mlless.training.rounds import RoundAccumulator

#: What a step that sends nothing selects.
_NOTHING = (np.zeros(0, np.int32), np.zeros(0, np.float32))


class NormFilter(RoundAccumulator):
    """δ = x − shared over the replica ``x``, sent whole per group of ``bounds`` once its sum of relative norms
    passes ``threshold``."""

    def __init__(self, x: np.ndarray, threshold: float, bounds: np.ndarray | None = None) -> None:
        super().__init__(x)
        if not (math.isfinite(threshold) and threshold >= 0):
            raise ValueError(f"the norm filter's threshold must be a finite value >= 0, got {threshold}")
        bounds = np.array([0, x.shape[0]] if bounds is None else bounds, np.int64)
        if bounds.ndim != 1 or len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != x.shape[0] or \
                np.any(np.diff(bounds) < 0):
            raise ValueError(f"segment bounds must rise from 0 to the model's {x.shape[0]} parameters")
        self.threshold = float(threshold)
        self.bounds = bounds
        #: Each group's Σ ‖δ_k‖ / ‖x_k‖ since it was last sent.
        self.sums = np.zeros(len(bounds) - 1)

    def ratios(self) -> np.ndarray:
        """‖δ_s‖ / ‖x_s‖ of each group s now: 0 where nothing is pending, inf where x_s is 0 and δ_s is not."""
        self._rejoin()
        delta = self.x - self.shared
        out = np.zeros(len(self.sums))
        for s, (lo, hi) in enumerate(zip(self.bounds[:-1], self.bounds[1:])):
            d, x = delta[lo:hi], self.x[lo:hi]
            moved = math.sqrt(float(np.dot(d, d)))
            if moved:
                size = math.sqrt(float(np.dot(x, x)))
                out[s] = moved / size if size else math.inf
        return out

    def step(self, idx: np.ndarray, delta: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
        """`accumulate` a step's update, add each group's relative norm to its sum, and select the groups whose
        sum passed the threshold (and start their sums again)."""
        self.accumulate(idx, delta)
        self.sums += self.ratios()
        due = self.sums > self.threshold
        if not due.any():
            return _NOTHING
        self.sums[due] = 0.0
        self.hold(np.repeat((~due).astype(np.uint8), np.diff(self.bounds)))
        return self.select(t)

    def restore(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Replace the accumulator with ``pending()``'s arrays; the sums start from 0 (they are not checkpointed:
        a restored worker sends its pending update a little later than it would have)."""
        super().restore(idx, values)
        self.sums[:] = 0.0
