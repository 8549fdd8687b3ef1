"""The accumulator of a protocol that publishes once per round (model averaging, blocked): δ = x − shared.

Such a protocol selects nothing inside a round and everything at its end, as the significance filter at v = 0
would; but the filter's timing wheel keeps each entry's due step current at every local step, and on PMF that
cost a worker as long as the step's training (`benchmarks/scaling.py`, the filter phase). Here a local step only
marks the entries it changed; the accumulated update is read off at the round's end as the replica minus a copy
of the shared state, which moves with every change the worker did not train itself (a peer's update, a leaver's
merge, an averaging correction). `Replica` drives it through the same methods as `SignificanceFilter`.
"""
from __future__ import annotations

import numpy as np


class RoundAccumulator:
    """δ = x − shared over the replica ``x``, for the entries a local step marked."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x
        self.shared = x.copy()
        self.changed = np.zeros(x.shape[0], dtype=bool)

    def accumulate(self, idx: np.ndarray, delta: np.ndarray) -> None:
        """The replica moved by its own update at ``idx``: already in x − shared, so only marked."""
        self.changed[idx] = True

    def step(self, idx: np.ndarray, delta: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
        self.accumulate(idx, delta)
        return self.select(t)

    def touched(self, idx: np.ndarray, values: np.ndarray) -> None:
        """The replica moved by ``values`` at ``idx`` (unique), someone else's update: so does the shared state."""
        self.shared[idx] += values

    def unsent(self, idx: np.ndarray, values: np.ndarray) -> None:
        """``values`` were published, and no peer will apply them: they are this replica's own again."""
        self.shared[idx] -= values
        self.changed[idx] = True

    def select(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Everything accumulated (threshold 0), which becomes shared."""
        idx, values = self.pending()
        self.shared[idx] = self.x[idx]
        self.changed[:] = False
        return idx, values

    def pending_count(self) -> int:
        """Entries changed since the round's start (an upper bound: a change may have cancelled out)."""
        return int(np.count_nonzero(self.changed))

    def pending(self) -> tuple[np.ndarray, np.ndarray]:
        idx = np.flatnonzero(self.changed).astype(np.int32)
        values = self.x[idx] - self.shared[idx]
        moved = values != 0
        return idx[moved], values[moved]

    def restore(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Replace the accumulator with ``pending()``'s arrays, after the replica itself was restored."""
        self.shared[:] = self.x
        self.shared[idx] -= values
        self.changed[:] = False
        self.changed[idx] = True
