"""ISP significance filter (papers 002 §4.1, 000 §4.1).

Each worker accumulates, per parameter, the updates δ_i it applied locally
since it last sent parameter i.  After a step it sends exactly the entries
with |δ_i / x_i| > v_t (v_t = v/√t) and zeroes them; the rest keep
accumulating.  A fresh weight (x_i == 0) with δ_i ≠ 0 is always significant,
and v = 0 sends every non-zero δ_i, which is BSP.

A dirty list tracks which entries may be non-zero, so `select` costs
O(entries updated since last sent) rather than a pass over the whole model.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from mlless.kernels import significance as _k


def isp_threshold(v: float, t: int) -> float:
    """v_t = v / √t, with t starting at 1."""
    if t < 1:
        raise ValueError(f"ISP step t starts at 1, got {t}")
    return v / math.sqrt(t)


class SignificanceFilter:
    """Per-parameter accumulator δ with significance-based selection."""

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self._acc = np.zeros(self.size, dtype=np.float32)
        self._flags = np.zeros(self.size, dtype=np.uint8)
        self._dirty = np.empty(self.size, dtype=np.int32)
        self._n_dirty = 0

    @property
    def accumulator(self) -> np.ndarray:
        """Read-only view of δ (for tests and metrics)."""
        view = self._acc.view()
        view.flags.writeable = False
        return view

    def accumulate(self, idx: np.ndarray, delta: np.ndarray) -> None:
        """δ[idx] += delta (idx may repeat; each occurrence is added)."""
        self._n_dirty = _k.accumulate(self._acc, self._flags, self._dirty, self._n_dirty,
                                      np.ascontiguousarray(idx, dtype=np.int32),
                                      np.ascontiguousarray(delta, dtype=np.float32))

    def select(self, x: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
        """Pop entries with |δ_i / x_i| > threshold (x_i == 0, δ_i ≠ 0 counts); x is the updated replica.

        The returned values are exactly the accumulated δ_i; those entries are
        reset to 0 and unsent ones stay accumulated.
        """
        if threshold < 0 or not math.isfinite(threshold):
            raise ValueError(f"threshold must be a finite value >= 0, got {threshold}")
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.shape != (self.size,):
            raise ValueError(f"replica has shape {x.shape}, filter expects ({self.size},)")
        idx, values, self._n_dirty = _k.select(self._acc, self._flags, self._dirty, self._n_dirty, x,
                                               float(threshold), threshold == 0)
        return idx, values

    def drain(self) -> tuple[np.ndarray, np.ndarray]:
        """Pop every pending non-zero entry (a worker leaving hands its residue on)."""
        idx, values, self._n_dirty = _k.select(self._acc, self._flags, self._dirty, self._n_dirty,
                                               self._acc, 0.0, True)
        return idx, values

    def pending_count(self) -> int:
        """Entries in the dirty list (an upper bound on the non-zero δ_i)."""
        return int(self._n_dirty)

    def pending(self) -> tuple[np.ndarray, np.ndarray]:
        """The non-zero accumulated entries (sorted int32 idx, float32 values), left in place."""
        dirty = np.sort(self._dirty[: self._n_dirty])
        values = self._acc[dirty]
        keep = values != 0
        return dirty[keep].astype(np.int32), values[keep].copy()

    def state(self) -> dict[str, np.ndarray]:
        """Checkpointable arrays: the pending entries as (idx, values)."""
        idx, values = self.pending()
        return {"pending_idx": idx, "pending_values": values}

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Replace the accumulator with a `state()` snapshot."""
        try:
            idx = np.asarray(state["pending_idx"])
            values = np.asarray(state["pending_values"])
        except KeyError as exc:
            raise ValueError(f"significance state lacks {exc}") from exc
        if idx.dtype != np.int32 or values.dtype != np.float32 or idx.shape != values.shape or idx.ndim != 1:
            raise ValueError("significance state must be matching 1-D int32 idx and float32 values")
        if len(np.unique(idx)) != len(idx):
            raise ValueError("significance state repeats an index")
        self._acc[:] = 0
        self._flags[:] = 0
        self._n_dirty = 0
        self.accumulate(idx, values)
