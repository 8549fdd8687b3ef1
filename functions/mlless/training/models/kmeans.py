"""Mini-batch k-means (Sculley, "Web-scale k-means clustering", WWW 2010) over feature rows, labels ignored.

Replica layout: the k centroids, row-major (k x n_features), then each centroid's count of rows assigned so far.
A step assigns each row of the batch to its nearest centroid and moves centroid c by its own rate, 1 / count:
with m of the batch's rows and their sum S, c <- c + lr (S - m c) / (v + W m) and v <- v + m, which at lr = 1 and
W = 1 is exactly Sculley's per-row loop (c stays the mean of every row it was ever assigned).

Both moves are updates like any other. Under a protocol that sums the replicas' updates (bsp, isp, ssp) P workers
each assign about m of the step's P m rows to c, so W = P workers (`Replica.workers`) makes the summed move the
one a single worker would take over all P m rows, and the counts sum to the rows assigned job-wide. Under model
averaging (averaging, async) W = 1: each worker runs Sculley's loop on its own, centroids and counts are averaged,
and the averaged counts (rows / P) make the averaged moves the job-wide ones (W: sync/base.py).

The centroids start from k-means++ seeds (Arthur and Vassilvitskii 2007), greedy as scikit-learn's (2 + ln k
candidates a seed, the one that lowers the potential most), drawn from the first training batches, which every
worker and the supervisor read: the seeds are the same everywhere for one job seed. Each of `INIT_TRIES` seedings
is refined by Lloyd's iterations on those rows, and the one of least inertia on them is kept (scikit-learn's
MiniBatchKMeans keeps the best of its n_init seedings). Without the refinement, Sculley's 1 / count rates freeze the
first batches' assignments: on 18k rows of 8 blobs three epochs ended 13 % above scikit-learn's KMeans, whose
Lloyd's iterations from the same seeds reached its own optimum.
Distances go through ||x||^2 - 2 x.c + ||c||^2 with a sparse x, so hashed rows cost their non-zeros; the dense
sets are CSR rows too.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import scipy.sparse as sp

from mlless.data.batches import Batch, SparseBatch
from mlless.spec.config import ModelConfig
from mlless.spec.models import model_type
from mlless.training.models.base import Model, TrainingData, expect_batch, register, required_dim

#: The k-means++ seeds are drawn from the first training batches, up to this many rows (scikit-learn's
#: MiniBatchKMeans draws them from 3 x its batch of 1024 rows; more rows see the small clusters too)...
INIT_ROWS = 10_000
#: ...and at least this many rows a cluster, when k is large.
INIT_ROWS_PER_CLUSTER = 100
#: Seedings tried; the one of least inertia on the seed rows is kept (scikit-learn's MiniBatchKMeans: n_init 3).
INIT_TRIES = 3
#: Lloyd's iterations on the seed rows at most (scikit-learn's KMeans: 300; they stop once no row changes cluster).
LLOYD_ROUNDS = 50


def _csr(batch: Batch, n_features: int) -> sp.csr_matrix:
    b = expect_batch(batch, SparseBatch, "kmeans")
    keep = b.indices < n_features  # features outside the model (a validation row's) are ignored, as the others do
    if keep.all():
        return sp.csr_matrix((b.values, b.indices, b.indptr), shape=(len(b), n_features))
    rows = np.repeat(np.arange(len(b)), np.diff(b.indptr))[keep]
    return sp.csr_matrix((b.values[keep], (rows, b.indices[keep])), shape=(len(b), n_features))


def squared_distances(x: sp.csr_matrix, centroids: np.ndarray) -> np.ndarray:
    """(rows, k) squared Euclidean distances, float64, clipped at 0 (the expansion can round below it)."""
    c = centroids.astype(np.float64, copy=False)
    rows = np.asarray(x.multiply(x).sum(axis=1)).reshape(-1, 1)
    d = rows - 2.0 * np.asarray(x @ c.T) + np.einsum("kd,kd->k", c, c)
    return np.maximum(d, 0.0, out=d)


def cluster_sums(x: sp.csr_matrix, nearest: np.ndarray, k: int, clusters: np.ndarray) -> np.ndarray:
    """The sum of the rows of ``x`` assigned (``nearest``, of ``k``) to each of ``clusters``: dense,
    (len(clusters), n_features)."""
    members = sp.csr_matrix((np.ones(len(nearest)), (nearest, np.arange(len(nearest)))), shape=(k, x.shape[0]))
    return np.asarray((members[clusters] @ x).todense())


def kmeans_plus_plus(x: sp.csr_matrix, k: int, rng: np.random.Generator) -> np.ndarray:
    """Greedy k-means++ seeds: k rows of ``x`` (dense float64, (k, n_features))."""
    n = x.shape[0]
    trials = 2 + int(math.log(k))
    centres = np.empty((k, x.shape[1]))
    centres[0] = x[int(rng.integers(n))].toarray()
    closest = squared_distances(x, centres[:1])[:, 0]
    for c in range(1, k):
        total = closest.sum()
        if total <= 0:  # fewer distinct rows than clusters: any row will do
            candidates = rng.integers(n, size=trials)
        else:
            candidates = np.minimum(np.searchsorted(np.cumsum(closest), rng.random(trials) * total), n - 1)
        dense = x[candidates].toarray()
        potentials = np.minimum(closest[:, None], squared_distances(x, dense))
        best = int(np.argmin(potentials.sum(axis=0)))
        centres[c], closest = dense[best], potentials[:, best]
    return centres


def lloyd(x: sp.csr_matrix, centres: np.ndarray) -> tuple[np.ndarray, float]:
    """Lloyd's iterations from ``centres`` over ``x``: (centres, inertia). An empty cluster keeps its centre."""
    nearest = None
    for _ in range(LLOYD_ROUNDS):
        d = squared_distances(x, centres)
        now = d.argmin(axis=1)
        if nearest is not None and np.array_equal(now, nearest):
            break
        nearest = now
        counts = np.bincount(nearest, minlength=len(centres))
        hit = np.flatnonzero(counts)
        centres[hit] = cluster_sums(x, nearest, len(centres), hit) / counts[hit, None]
    return centres, float(squared_distances(x, centres).min(axis=1).sum())


@register
class KMeans(Model):
    """k centroids over a CSR `SparseBatch`; loss metric the mean squared distance to the nearest centroid."""

    type = model_type("kmeans")
    shape_dims = ("n_features",)

    @classmethod
    def from_dims(cls, dims: Mapping[str, Any], config: ModelConfig | None, seed: int) -> KMeans:
        """Needs ``n_features``; the centroids start at 0 until `initialise` seeds them."""
        return cls(int(required_dim(dims, "n_features", cls.kind)), config)

    def __init__(self, n_features: int, config: ModelConfig | None = None) -> None:
        config = config or ModelConfig(self.kind)
        if n_features < 1:
            raise ValueError(f"n_features must be >= 1, got {n_features}")
        self.n_features, self.k = int(n_features), int(config.options["clusters"])
        super().__init__(self.k * (self.n_features + 1))
        self.centroids = self.params[: self.k * self.n_features].reshape(self.k, self.n_features)
        self.counts = self.params[self.k * self.n_features:]

    def initialise(self, data: TrainingData, seed: int) -> None:
        """k-means++ seeds from the first training batches, refined by Lloyd's iterations on them (the module's
        docstring); counts start at 0."""
        want = max(INIT_ROWS, INIT_ROWS_PER_CLUSTER * self.k)
        parts, rows = [], 0
        for i in range(data.n_batches):
            if rows >= want:
                break
            parts.append(_csr(data.batch(i), self.n_features))
            rows += parts[-1].shape[0]
        x = sp.vstack(parts, format="csr")[:want] if parts else sp.csr_matrix((0, self.n_features))
        if x.shape[0] < self.k:
            raise ValueError(f"spec.model.clusters: {self.k} is more than the {x.shape[0]} training rows")
        rng = np.random.default_rng([seed, 0x4B4D])
        centres, _ = min((lloyd(x, kmeans_plus_plus(x, self.k, rng)) for _ in range(INIT_TRIES)), key=lambda r: r[1])
        self.centroids[:] = centres
        self.counts[:] = 0.0

    def own_step(self, batch: Batch, lr: float, workers: int) -> tuple[np.ndarray, np.ndarray, float, int]:
        x = _csr(batch, self.n_features)
        d = squared_distances(x, self.centroids)
        nearest = d.argmin(axis=1)
        loss = float(d[np.arange(len(nearest)), nearest].sum())
        m = np.bincount(nearest, minlength=self.k).astype(np.float64)
        hit = np.flatnonzero(m)
        sums = cluster_sums(x, nearest, self.k, hit)
        rate = lr / (self.counts[hit].astype(np.float64) + max(1, workers) * m[hit])
        move = (rate[:, None] * (sums - m[hit, None] * self.centroids[hit])).astype(np.float32)
        self.centroids[hit] += move
        self.counts[hit] += m[hit].astype(np.float32)
        width = self.n_features
        idx = np.concatenate([(hit[:, None] * width + np.arange(width)).ravel(), self.k * width + hit]).astype(np.int32)
        return idx, np.concatenate([move.ravel(), m[hit].astype(np.float32)]), loss, int(x.shape[0])

    def gradient(self, batch: Batch) -> tuple[np.ndarray, np.ndarray, float, int]:
        raise ValueError("kmeans trains by its own rule (Model.own_step), not by a gradient")

    def assign(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """Each row's nearest centroid and its squared distance to it."""
        d = squared_distances(_csr(batch, self.n_features), self.centroids)
        nearest = d.argmin(axis=1)
        return nearest, d[np.arange(len(nearest)), nearest]

    def predict(self, batch: Batch) -> np.ndarray:
        """Each row's cluster: the index of its nearest centroid."""
        return self.assign(batch)[0].astype(np.int32)

    def evaluate(self, batch: Batch) -> tuple[float, int]:
        distances = self.assign(batch)[1]
        return float(distances.sum()), len(distances)

    def dims(self) -> dict[str, Any]:
        return {"n_features": self.n_features}

    def config(self) -> ModelConfig:
        return ModelConfig.of(self.kind, clusters=self.k)
