"""ISP significance filter: each worker sends only the significant part of its accumulated update.

Each worker accumulates, per parameter, the updates δ_i it applied locally
since it last sent parameter i.  After step t it sends exactly the entries
with |δ_i| > (v/√t)·|x_i| and zeroes them; the rest keep accumulating.  A
fresh weight (x_i == 0) with δ_i ≠ 0 is always significant, and v = 0 sends
every non-zero δ_i, which is BSP.

The pending entries wait in a timing wheel (`mlless.training.kernels.significance`)
by the step they will become significant, so a step costs the entries whose
δ or x changed plus those that fall due, not a pass over everything pending.
That is why the filter must hear of every change to the replica: `accumulate`
for the worker's own update, `touched` for its peers'.
"""
from __future__ import annotations

import math

import numpy as np

from mlless.training.kernels.significance import TimingWheel


class SignificanceFilter:
    """Per-parameter accumulator δ over the replica ``x``, with significance-based selection at threshold ``v``."""

    def __init__(self, x: np.ndarray, v: float, wheel_bits: int = 6) -> None:
        if x.dtype != np.float32 or x.ndim != 1 or not x.flags.c_contiguous:
            raise ValueError("the replica must be a contiguous 1-D float32 array")
        if v < 0 or not math.isfinite(v):
            raise ValueError(f"the ISP threshold v must be a finite value >= 0, got {v}")
        self.size = x.shape[0]
        self.v = float(v)
        # wheel_bits shapes the wheel (2^bits buckets per level); the tests vary it, the selections never change.
        self._wheel = TimingWheel(x, self.v, wheel_bits)
        self._acc = self._wheel.slots["acc"]

    def accumulate(self, idx: np.ndarray, delta: np.ndarray) -> None:
        """δ[idx] += delta (idx may repeat; each occurrence is added), after the replica moved by ``delta``."""
        self._wheel.add(_indices(idx), np.ascontiguousarray(delta, dtype=np.float32))

    def before_alone(self) -> None:
        """A step alone in the job comes next: nothing to do before it (`alone` follows it)."""

    def alone(self, idx: np.ndarray, delta: np.ndarray) -> None:
        """The replica moved by its own update, which no peer needs (alone in the job): it is not accumulated, and
        the pending entries' due steps change with x."""
        self.touched(idx, delta)

    def unsent(self, idx: np.ndarray, values: np.ndarray) -> None:
        """``values`` were selected and published, and no peer will apply them: they accumulate again."""
        self.accumulate(idx, values)

    def step(self, idx: np.ndarray, delta: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
        """`accumulate` a step's update (``idx`` without repeats, as optimizers return it), then `select` at step ``t``."""
        if self.v == 0.0 and self._wheel.pending == 0:
            # BSP holds nothing back, so the update itself is the selection: no pass over it is needed.
            sent = delta != 0
            return (idx, delta) if sent.all() else (idx[sent], delta[sent])
        self.accumulate(idx, delta)
        return self.select(t)

    def touched(self, idx: np.ndarray, values: np.ndarray | None = None) -> None:
        """The replica moved at ``idx`` (by ``values``) with someone else's update: the entries' due steps change
        with x."""
        if self._wheel.pending:  # (BSP never has any)
            self._wheel.touch(_indices(idx))

    def select(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Pop the entries significant at step ``t`` against the current replica: (idx int32, δ float32).

        The returned values are exactly the accumulated δ_i; those entries are
        reset to 0 and unsent ones stay accumulated.
        """
        return self._wheel.select(int(t))

    def pending_count(self) -> int:
        """Entries with δ_i ≠ 0."""
        return self._wheel.pending

    def pending(self) -> tuple[np.ndarray, np.ndarray]:
        """The non-zero accumulated entries (sorted int32 idx, float32 values), left in place."""
        idx = np.flatnonzero(self._acc).astype(np.int32)
        return idx, self._acc[idx]

    def restore(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Replace the accumulator with ``pending()``'s arrays, after the replica itself was restored."""
        self._wheel.restore(_indices(idx), np.ascontiguousarray(values, dtype=np.float32))


def _indices(idx: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(idx, dtype=np.int32)
