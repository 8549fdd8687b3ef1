"""The accumulator of a protocol that publishes once per round (model averaging, blocked): δ = x − shared.

Such a protocol selects nothing inside a round and everything at its end, as the significance filter at v = 0
would; but the filter's timing wheel keeps each entry's due step current at every local step, and on PMF that
cost a worker as long as the step's training (`benchmarks/scaling.py`, the filter phase). Here a local step only
marks the entries it changed; the accumulated update is read off at the round's end as the replica minus a copy
of the shared state, which moves with every change the worker did not train itself (a peer's update, a leaver's
merge, an averaging correction). `Replica` drives it through the same methods as `SignificanceFilter`.

Entries it `hold`s stay pending at a round's end: blocked keeps the rows of its own users at home
(`runtime/sync/blocked.py`); they are shared with the rest once no longer held, or as pending entries (a leaver's
merge, the final replicas, a snapshot's).
"""
from __future__ import annotations

import numpy as np

from mlless.training.kernels import optim as _optim


class RoundAccumulator:
    """δ = x − shared over the replica ``x``, for the entries a local step marked."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x
        self.shared = x.copy()
        self.changed = np.zeros(x.shape[0], dtype=np.uint8)
        self.held = np.zeros(x.shape[0], dtype=np.uint8)
        self.marked = 0  # how many entries `changed` marks: counting them at every step cost a PMF worker 5 %
        # Alone in the job, a step's move is the shared state's (`Replica.step`); rather than move `shared` with
        # each such step, the pending entries are set aside and `shared` is rebuilt from them when a peer appears.
        self._set_aside: tuple[np.ndarray, np.ndarray] | None = None

    def alone(self, idx: np.ndarray, delta: np.ndarray) -> None:
        """The replica moved by its own update, which no peer needs: not pending."""
        if self._set_aside is None:
            self.shared[idx] += delta  # x has moved by it already: the first such step moves `shared` too
            self._set_aside = self.pending()

    def _rejoin(self) -> bool:
        """Rebuild `shared` from the entries set aside, with x as it is now; whether it was."""
        if self._set_aside is None:
            return False
        set_aside, self._set_aside = self._set_aside, None
        self.restore(*set_aside)
        return True

    def accumulate(self, idx: np.ndarray, delta: np.ndarray) -> None:
        """The replica moved by its own update at ``idx``: already in x − shared, so only marked."""
        if self._rejoin():
            self.shared[idx] -= delta  # x has moved by it already
        self.marked += _optim.mark(self.changed, np.ascontiguousarray(idx, dtype=np.int32))

    def step(self, idx: np.ndarray, delta: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
        self.accumulate(idx, delta)
        return self.select(t)

    def touched(self, idx: np.ndarray, values: np.ndarray) -> None:
        """The replica moved by ``values`` at ``idx`` (unique), someone else's update: so does the shared state."""
        self._rejoin()
        _optim.add_at(self.shared, np.ascontiguousarray(idx, dtype=np.int32), np.ascontiguousarray(values, dtype=np.float32))

    def unsent(self, idx: np.ndarray, values: np.ndarray) -> None:
        """``values`` were published, and no peer will apply them: they are this replica's own again."""
        self._rejoin()
        self.shared[idx] -= values
        self.changed[idx] = 1
        self.marked = int(np.count_nonzero(self.changed))

    def hold(self, entries: np.ndarray) -> None:
        """From now on `select` leaves the entries of the uint8 mask `entries` pending; others held so far are not."""
        self.held[:] = entries

    def select(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Everything accumulated but the held entries (threshold 0), which becomes shared."""
        self._rejoin()
        idx, values, self.marked = _optim.take_changed(self.x, self.shared, self.changed, self.held)
        return idx, values

    def pending_count(self) -> int:
        """Entries changed since the round's start (an upper bound: a change may have cancelled out)."""
        if self._set_aside is not None:
            return len(self._set_aside[0])
        return self.marked

    def pending(self) -> tuple[np.ndarray, np.ndarray]:
        if self._set_aside is not None:
            return self._set_aside
        idx = np.flatnonzero(self.changed).astype(np.int32)
        values = self.x[idx] - self.shared[idx]
        moved = values != 0
        return idx[moved], values[moved]

    def restore(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Replace the accumulator with ``pending()``'s arrays, after the replica itself was restored."""
        self._set_aside = None
        self.shared[:] = self.x
        self.shared[idx] -= values
        self.changed[:] = 0
        self.changed[idx] = 1
        self.marked = len(idx)
