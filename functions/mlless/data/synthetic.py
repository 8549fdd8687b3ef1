"""Synthetic datasets of any size, generated chunk by chunk with bounded memory.

* PMF: ratings = mu + U_u . V_i + noise, with U, V ~ N(0, rank**-0.5) so the
  low-rank part has unit variance; clipped to [1, 5] unless `clip=False`.
  Users and items are Zipf-distributed with exponent `skew` (0 = uniform):
  real ratings are skewed that way, and uniform ids would hide the cache and
  load-balance effects of popular rows.  The default 0.8 gives the top 1 % of
  items about 30 % of the ratings.  Rows are independent, so a 10M-rating
  ML-10M-sized set (70k x 10k) takes a few seconds to generate.
* LR: Criteo-shaped sparse rows, 13 "integer" columns (each present with
  p=0.8, geometric-ish counts) and 26 categoricals (present with p=0.9, a
  skewed per-column vocabulary) hashed exactly like Criteo, so ~37 nnz per
  row; the values of each column are Zipf-distributed with exponent `skew`,
  as in real click logs.  Labels are Bernoulli(sigmoid(w.x + b)) for a planted weight vector w
  over the hashed space (integers enter as log1p, as the default transform
  writes them), so a model can actually learn something.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator

import numpy as np

from mlless.data.chunks import RatingsChunk, SparseChunk
from mlless.data.formats import CRITEO_CAT_COLUMNS, CRITEO_INT_COLUMNS, criteo_feature_indices
from mlless.data.hashing import hash_ints

CHUNK_ROWS = 1 << 20
#: Zipf exponent of user, item and categorical-value popularity (0: uniform).
DEFAULT_SKEW = 0.8


@dataclass(frozen=True)
class PmfParams:
    rows: int = 1_000_000
    users: int = 6_000
    items: int = 4_000
    rank: int = 10
    noise: float = 0.5
    mean: float = 3.5
    bias: float = 0.4  # std of the user and item biases, as real ratings have them
    clip: bool = True
    skew: float = DEFAULT_SKEW

    def describe(self) -> dict:
        return {"synthetic": "pmf", **asdict(self)}


@dataclass(frozen=True)
class LrParams:
    rows: int = 1_000_000
    hash_bits: int = 18
    vocabulary: int = 10_000
    bias: float = -1.0
    skew: float = DEFAULT_SKEW

    def describe(self) -> dict:
        return {"synthetic": "lr", **asdict(self)}


class Zipf:
    """Ids 0..n-1 with P(id of popularity rank k) ∝ k^-skew; the popular ids are scattered, not 0, 1, 2, ..."""

    def __init__(self, n: int, skew: float, rng: np.random.Generator) -> None:
        if skew < 0:
            raise ValueError(f"skew must be >= 0, got {skew}")
        weights = np.arange(1, n + 1, dtype=np.float64) ** -skew
        self.cdf = np.cumsum(weights / weights.sum())
        self.ids = rng.permutation(n)

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        ranks = np.searchsorted(self.cdf, rng.random(size) * self.cdf[-1], side="right")
        return self.ids[np.minimum(ranks, len(self.ids) - 1)]


def generate_pmf(p: PmfParams, seed: int) -> Iterator[RatingsChunk]:
    rng = np.random.default_rng([seed, 0x504D46])
    scale = p.rank ** -0.25  # each factor N(0, rank^-1/4) -> dot product has unit variance
    U = rng.normal(0.0, scale, size=(p.users, p.rank)).astype(np.float32)
    V = rng.normal(0.0, scale, size=(p.items, p.rank)).astype(np.float32)
    user_bias = rng.normal(0.0, p.bias, size=p.users).astype(np.float32)
    item_bias = rng.normal(0.0, p.bias, size=p.items).astype(np.float32)
    user_ids, item_ids = Zipf(p.users, p.skew, rng), Zipf(p.items, p.skew, rng)
    for start in range(0, p.rows, CHUNK_ROWS):
        n = min(CHUNK_ROWS, p.rows - start)
        crng = np.random.default_rng([seed, 0x504D46, start])
        users = user_ids.sample(crng, n)
        items = item_ids.sample(crng, n)
        r = np.einsum("ij,ij->i", U[users], V[items]) + user_bias[users] + item_bias[items] + p.mean
        r += crng.normal(0.0, p.noise, size=n).astype(np.float32)
        if p.clip:
            np.clip(r, 1.0, 5.0, out=r)
        keys = np.arange(start, start + n, dtype=np.int64)
        yield RatingsChunk(keys, users.astype(np.int64), items.astype(np.int64), r.astype(np.float32))


def generate_lr(p: LrParams, seed: int) -> Iterator[SparseChunk]:
    n_features = 1 << p.hash_bits
    rng = np.random.default_rng([seed, 0x4C52])
    # Strong enough that a model trained on a few thousand rows measurably beats the base rate.
    w = rng.normal(0.0, 2.0, size=n_features).astype(np.float32)
    w[:CRITEO_INT_COLUMNS] = rng.normal(0.0, 0.3, size=CRITEO_INT_COLUMNS)
    width = CRITEO_INT_COLUMNS + CRITEO_CAT_COLUMNS
    values = Zipf(p.vocabulary, p.skew, rng)
    step = CHUNK_ROWS // 4
    for start in range(0, p.rows, step):
        n = min(step, p.rows - start)
        crng = np.random.default_rng([seed, 0x4C52, start])
        ints = np.floor(crng.exponential(5.0, size=(n, CRITEO_INT_COLUMNS))).astype(np.float32)
        vocab = values.sample(crng, (n, CRITEO_CAT_COLUMNS)).astype(np.int64)
        cols = np.broadcast_to(np.arange(CRITEO_CAT_COLUMNS, dtype=np.int64), vocab.shape)
        cat = criteo_feature_indices(hash_ints(vocab * CRITEO_CAT_COLUMNS + cols, 0x43415453), p.hash_bits)
        index = np.empty((n, width), dtype=np.int32)
        index[:, :CRITEO_INT_COLUMNS] = np.arange(CRITEO_INT_COLUMNS)
        index[:, CRITEO_INT_COLUMNS:] = cat.reshape(n, CRITEO_CAT_COLUMNS)
        value = np.ones((n, width), dtype=np.float32)
        value[:, :CRITEO_INT_COLUMNS] = ints
        present = np.empty((n, width), dtype=bool)
        present[:, :CRITEO_INT_COLUMNS] = crng.random((n, CRITEO_INT_COLUMNS)) < 0.8
        present[:, CRITEO_INT_COLUMNS:] = crng.random((n, CRITEO_CAT_COLUMNS)) < 0.9
        x = np.where(index < CRITEO_INT_COLUMNS, np.log1p(value), value)
        logit = (w[index] * x * present).sum(axis=1) / np.sqrt(width) + p.bias
        labels = (crng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(present.sum(axis=1), out=indptr[1:])
        keys = np.arange(start, start + n, dtype=np.int64)
        yield SparseChunk(keys, labels, indptr, index[present], value[present])
