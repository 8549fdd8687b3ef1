"""Aggregation rules: how a step's updates are combined (`spec.sync.aggregation`), one registered class each.

`sum` adds every update, as replicas always have (`sums.sparse_sum`). The Byzantine-robust rules replace the
mean of the n updates of a step by a robust centre and scale it back by n, so that with honest workers they move
the replicas as far as the sum does (the learning rates stay the sum's):

* `median`: the coordinate-wise median;
* `trimmed-mean`: per coordinate, the mean after dropping the f largest and the f smallest values;
* `krum`: Multi-Krum (Blanchard et al. 2017; El Mhamdi et al. 2018): each update is scored by its squared distances
  to its n − f − 2 nearest updates, and the mean of the n − f best-scored updates is taken;
* `carrier-trimmed-mean`: a norm bound, then per entry a trimmed mean over only the updates that carry it.

f = ⌊`spec.sync.trim` · n⌋, at most (n − 1) / 2. Updates are sparse (ISP and BSP send only non-zero or significant
entries): under the first three a worker that did not send a coordinate counts as proposing 0 for it, which is
what its dense update holds there (its batch did not touch the row, or its change stayed below the significance
filter). So a row moves under `median` only when most updates of the step carry it: on sparse models (PMF, hashed
features) those rules learn slower per step than the sum, and `carrier-trimmed-mean` counts only the carriers.

A rule is applied wherever a step's updates are combined: by an all-to-all worker over its peers' updates and its
own (`exchanges.alltoall.AllToAll`), and by the owner that merges a partition under allreduce and scatter-reduce
(`reduce.ScatterReduce.merge`). A rule defined outside the package registers with `register`, as a sync strategy
does (`mlless.spec.registry`).
"""
from __future__ import annotations

from typing import ClassVar, Sequence

import numpy as np

from mlless.spec.registry import Registry
from mlless.sync.sums import DENSE_ENOUGH, sparse_sum

#: (entries, values, carriers): the sorted entries of a combined update, its value at each (float64), and how many
#: updates count as carrying each.
Combined = tuple[np.ndarray, np.ndarray, np.ndarray]

def union(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct entries of `flat` and where each of its entries is among them. Entries that fill most of
    their range are marked over it (as `sparse_sum` bins them): np.unique took 4x as long on PMF's updates."""
    if not len(flat):
        return flat, np.zeros(0, np.int64)
    low = int(flat.min())
    span = int(flat.max()) + 1 - low
    if len(flat) < DENSE_ENOUGH * span:
        return np.unique(flat, return_inverse=True)
    marked = np.zeros(span, bool)
    marked[flat - low] = True
    present = np.flatnonzero(marked)
    place = np.zeros(span, np.int64)
    place[present] = np.arange(len(present))
    return (present + low).astype(flat.dtype), place[flat - low]


def block(indices: Sequence[np.ndarray], values: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The union of the n updates' entries, the n × m block of their values there (0 where an update holds none)
    and the n × m mask of which update carries which entry."""
    entries, at = union(np.concatenate(indices))
    rows = np.repeat(np.arange(len(indices)), [len(idx) for idx in indices])
    dense = np.zeros((len(indices), len(entries)), np.float32)
    dense[rows, at] = np.concatenate(values)
    carried = np.zeros(dense.shape, bool)
    carried[rows, at] = True
    return entries, dense, carried


class Aggregation:
    """Combines the n updates of a step (sparse: int indices, float32 values) into one."""

    name: ClassVar[str]
    #: Whether the combined update is the plain sum, which replicas add peer by peer without combining.
    adds: ClassVar[bool] = False

    def __init__(self, trim: float) -> None:
        self.trim = trim

    def trimmed(self, n: int) -> int:
        """f: how many of n updates are assumed Byzantine."""
        return min(int(self.trim * n), (n - 1) // 2)

    def combine(self, indices: Sequence[np.ndarray], values: Sequence[np.ndarray]) -> Combined:
        """The n updates combined: n times the rule's centre over the union of their entries, each update carrying
        every entry (a missing entry is its 0)."""
        if not len(indices):
            return np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)
        entries, dense, _ = block(indices, values)
        return entries, len(indices) * self.centre(dense).astype(np.float64), np.full(len(entries), len(indices))

    def centre(self, dense: np.ndarray) -> np.ndarray:
        """The rule's centre of the n × m updates `dense` (one row each), for each of the m entries."""
        raise NotImplementedError


#: Every rule by the name `spec.sync.aggregation` gives it.
AGGREGATIONS: Registry[type[Aggregation]] = Registry("aggregation rule", "sync.aggregation")
register = AGGREGATIONS.register


def aggregation(name: str, trim: float) -> Aggregation:
    """The rule `spec.sync.aggregation` names; ValueError if none is registered under it."""
    return AGGREGATIONS.named(name)(trim)


@register
class Sum(Aggregation):
    """Every update added (today's replicas)."""

    name = "sum"
    adds = True

    def combine(self, indices: Sequence[np.ndarray], values: Sequence[np.ndarray]) -> Combined:
        return sparse_sum(indices, values)


@register
class Median(Aggregation):
    name = "median"

    def centre(self, dense: np.ndarray) -> np.ndarray:
        n, ordered = len(dense), np.sort(dense, axis=0)  # sorting a few rows is 2x faster than np.median
        return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2


@register
class TrimmedMean(Aggregation):
    name = "trimmed-mean"

    def centre(self, dense: np.ndarray) -> np.ndarray:
        f = self.trimmed(len(dense))
        return np.sort(dense, axis=0)[f:len(dense) - f].mean(axis=0)


@register
class Krum(Aggregation):
    name = "krum"

    def centre(self, dense: np.ndarray) -> np.ndarray:
        n = len(dense)
        f = self.trimmed(n)
        norms = np.einsum("ij,ij->i", dense, dense)
        distances = np.maximum(norms[:, None] + norms[None, :] - 2 * dense @ dense.T, 0)
        np.fill_diagonal(distances, np.inf)
        neighbours = max(1, min(n - f - 2, n - 1))
        scores = np.sort(distances, axis=1)[:, :neighbours].sum(axis=1) if n > 1 else np.zeros(1)
        return dense[np.argsort(scores, kind="stable")[:n - f]].mean(axis=0)


@register
class CarrierTrimmedMean(Aggregation):
    """For sparse models: per entry, a trimmed mean over only the updates that carry it, after a norm bound.

    An update whose L2 norm exceeds `BOUND` times the median of the step's n update norms is left out (an update that
    sent nothing counts as norm 0): with f ≤ (n − 1) / 2 Byzantine updates that median lies within the honest norms'
    range, so what is kept of any update has at most `BOUND` times an honest norm. Then each entry's k remaining
    carriers give k times their mean after dropping the min(f, (k − 1) / 2) largest and smallest values: with honest
    workers an entry moves about as far as the sum moves it, where `median` holds the absent updates' zeros against
    it. An entry with at least 2f + 1 carriers ends within its honest carriers' range; on one with fewer an attacker
    adds its (bounded) value, as under the sum."""

    name = "carrier-trimmed-mean"
    #: The norm bound, in median norms. PMF's honest updates (P = 4, batches of 1,000 ratings) ranged 0.78–1.14
    #: median norms over 3,164 updates, so 2 leaves out none of them; an attacker within the bound can still move the
    #: entries it alone carries by up to this many honest norms a step (docs/robustness.md).
    BOUND = 2.0

    def combine(self, indices: Sequence[np.ndarray], values: Sequence[np.ndarray]) -> Combined:
        n = len(indices)
        if not n:
            return np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)
        entries, dense, carried = block(indices, values)
        norms = np.sqrt(np.einsum("ij,ij->i", dense, dense, dtype=np.float64))
        # Left out rather than scaled down to the bound: a ×−10 update scaled down is still a sign flip of the entries
        # its worker alone carries. On PMF it ended +0.022 RMSE above the clean sum scaled to one median norm, +0.044
        # to two, +0.008 left out.
        carried &= (norms <= self.BOUND * np.median(norms))[:, None]
        # absent values sort last, so an entry's k carriers are the first k of its sorted column
        ordered = np.sort(np.where(carried, dense, np.inf), axis=0)
        ordered[np.isinf(ordered)] = 0
        running = np.vstack([np.zeros(len(entries)), np.cumsum(ordered, axis=0, dtype=np.float64)])
        k = carried.sum(axis=0)
        f = np.minimum(self.trimmed(n), np.maximum(k - 1, 0) // 2)
        column = np.arange(len(entries))
        kept = running[k - f, column] - running[f, column]
        # Every update counts as carrying every entry, as under the other robust rules: an entry whose one carrier
        # was left out does not move, and that worker's replica must take back its own value there too.
        return entries, k * kept / np.maximum(k - 2 * f, 1), np.full(len(entries), n)
