"""The accumulator of a protocol that publishes once per round (model averaging, blocked): δ = x − shared.

Such a protocol selects nothing inside a round and everything at its end, as the significance filter at v = 0
would; but the filter's timing wheel keeps each entry's due step current at every local step, and on PMF that
cost a worker as long as the step's training (`benchmarks/scaling.py`, the filter phase). Here a local step does
nothing: the accumulated update is read off at the round's end as the replica minus a copy of the shared state,
which moves with every change the worker did not train itself (a peer's update, a leaver's merge, an averaging
correction), in one dense pass (marking each step's entries instead cost a third of a PMF step). `Replica`
drives it through the same methods as `SignificanceFilter`.

Entries it `hold`s stay pending at a round's end: blocked keeps the rows of its own users at home
(`sync/protocols/blocked.py`); they are shared with the rest once no longer held, or as pending entries (a leaver's
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
        self.held = np.zeros(x.shape[0], dtype=np.uint8)
        #: Pending entries: exact after a round's end, and an upper bound inside a round (each step's counted as new).
        self.bound = 0
        # Alone in the job, a step's move is the shared state's (`Replica.step`); rather than move `shared` with
        # each such step, the pending entries are set aside before it (`before_alone`) and `shared` is rebuilt from
        # them when a peer appears.
        self._set_aside: tuple[np.ndarray, np.ndarray] | None = None

    def before_alone(self) -> None:
        """A step alone in the job comes next, whose move no peer needs: what is pending now is set aside (exactly:
        read off after the step, it would need `shared + delta`, which may round differently from the optimizer's
        own sum and leave an entry an ulp off), and `shared` is rebuilt from it when a peer appears."""
        if self._set_aside is None:
            self._set_aside = self.pending()

    def alone(self, idx: np.ndarray, delta: np.ndarray) -> None:
        """The replica moved by its own update, which no peer needs: nothing to do, as `before_alone` set aside
        what is pending."""

    def _rejoin(self) -> bool:
        """Rebuild `shared` from the entries set aside, with x as it is now; whether it was."""
        if self._set_aside is None:
            return False
        set_aside, self._set_aside = self._set_aside, None
        self.restore(*set_aside)
        return True

    def accumulate(self, idx: np.ndarray, delta: np.ndarray) -> None:
        """The replica moved by its own update at ``idx``: already in x − shared, so only counted."""
        if self._rejoin():
            self.shared[idx] -= delta  # x has moved by it already
        self._count(len(idx))

    def _count(self, entries: int) -> None:
        self.bound = min(self.bound + entries, self.x.shape[0])

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
        self._count(len(idx))

    def hold(self, entries: np.ndarray) -> None:
        """From now on `select` leaves the entries of the uint8 mask `entries` pending; others held so far are not."""
        self.held[:] = entries

    def select(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Everything accumulated but the held entries (threshold 0), which becomes shared."""
        self._rejoin()
        idx, values, self.bound = _optim.take_changed(self.x, self.shared, self.held)
        return idx, values

    def pending_count(self) -> int:
        """Entries pending: exact after a round's end, an upper bound inside a round."""
        if self._set_aside is not None:
            return len(self._set_aside[0])
        return self.bound

    def pending(self) -> tuple[np.ndarray, np.ndarray]:
        if self._set_aside is not None:
            return self._set_aside
        idx = np.flatnonzero(self.x != self.shared).astype(np.int32)
        return idx, self.x[idx] - self.shared[idx]

    def restore(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Replace the accumulator with ``pending()``'s arrays, after the replica itself was restored."""
        self._set_aside = None
        self.shared[:] = self.x
        self.shared[idx] -= values
        self.bound = len(idx)
