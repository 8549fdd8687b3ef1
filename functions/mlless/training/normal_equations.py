"""Linear regression's exact step where the dimension is small: the normal equations of the rows a replica has seen.

A replica accumulates XᵀX and Xᵀy over the features its rows hold (a dense d×d matrix, plus the bias) and, each
step, moves its weights towards the ridge solution of them. The squared loss is quadratic, so this one solve
replaces every first-order step: no learning rate, no noise left at the end, and nothing to drift once the rows
are all seen (the target stops moving). It is scale-free: the solve runs on features scaled by their largest
magnitude seen, where a ridge of `RIDGE` on the sums is scikit-learn's Ridge(alpha=1) on one-hot columns and
negligible on numeric ones.

Under P replicas whose moves are summed (every protocol of the linear family), each moves 1/P of the way to its
own solution: the sum lands on the replicas' mean solution, which on shards much larger than d is the whole
data's (measured in benchmarks/RESULTS.md, "Linear regression against Ridge"). Beyond `limit` distinct features
(hashed click logs) the d×d system is too large, and `step` returns None: the optimizer's rule trains instead.
A replica restored from a checkpoint starts its sums anew.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from mlless.data.batches import SparseBatch

#: The ridge added to the scaled sums' diagonal (the bias excepted): scikit-learn Ridge's default alpha, which
#: also keeps the system solvable when one-hot columns add up to the bias column.
RIDGE = 1.0


class NormalEquations:
    """The sums of one replica over at most `limit` features of `n_features` (the bias is `n_features`)."""

    def __init__(self, n_features: int, limit: int) -> None:
        self.n_features = n_features
        self.limit = limit
        self.slots = np.full(n_features, -1, dtype=np.int64)  # a feature's row in the sums, -1 before it is seen
        self.features = np.empty(0, dtype=np.int64)
        self.xtx = np.zeros((1, 1))  # the last row and column are the bias's
        self.xty = np.zeros(1)
        self.scale = np.ones(1)  # the largest |x_j| seen; 1 for the bias
        self.off = limit < 1

    def _grow(self, new: np.ndarray) -> None:
        old, grown = len(self.features), len(self.features) + len(new)
        self.slots[new] = np.arange(old, grown)
        self.features = np.concatenate([self.features, new])
        keep = np.r_[np.arange(old), grown]  # the bias moves to the end
        xtx = np.zeros((grown + 1, grown + 1))
        xtx[np.ix_(keep, keep)] = self.xtx
        xty, scale = np.zeros(grown + 1), np.zeros(grown + 1)
        xty[keep], scale[keep] = self.xty, self.scale
        self.xtx, self.xty, self.scale = xtx, xty, scale

    def step(self, params: np.ndarray, batch: SparseBatch,
             workers: int) -> tuple[np.ndarray, np.ndarray, float, int] | None:
        """Add `batch` to the sums and move `params` 1/`workers` of the way to their solution, in place: (idx int32,
        applied delta float32, loss_sum before the move, rows); None once the features outside the model's range
        are ignored and the rest exceed `limit` (from then on, always)."""
        if self.off:
            return None
        inside = (batch.indices >= 0) & (batch.indices < self.n_features)
        seen = np.unique(batch.indices[inside])
        new = seen[self.slots[seen] < 0]
        if len(self.features) + len(new) > self.limit:
            self.off = True  # a hashed click log: drop the sums for good
            self.xtx = self.xtx[:0, :0]
            return None
        if len(new):
            self._grow(new)
        d, n = len(self.features) + 1, len(batch)
        rows = np.repeat(np.arange(n), np.diff(batch.indptr))[inside]
        x = sp.csr_matrix((batch.values[inside].astype(np.float64), (rows, self.slots[batch.indices[inside]])),
                          shape=(n, d))
        x = sp.hstack([x[:, :-1], np.ones((n, 1))], format="csr")  # the bias column
        idx = np.r_[self.features, self.n_features].astype(np.int32)
        w = params[idx].astype(np.float64)
        y = batch.labels.astype(np.float64)
        loss = float(np.sum((x @ w - y) ** 2))
        self.xtx += (x.T @ x).toarray()
        self.xty += x.T @ y
        self.scale[:-1] = np.maximum(self.scale[:-1], abs(x[:, :-1]).max(axis=0).toarray().ravel())
        s = np.where(self.scale > 0, self.scale, 1.0)
        system = self.xtx / np.outer(s, s)
        system[np.arange(d - 1), np.arange(d - 1)] += RIDGE
        solution = np.linalg.lstsq(system, self.xty / s, rcond=None)[0] / s
        delta = ((solution - w) / max(1, workers)).astype(np.float32)
        params[idx] += delta
        return idx, delta, loss, n
