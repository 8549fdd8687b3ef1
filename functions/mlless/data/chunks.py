"""In-memory row chunks that flow from a parser (or generator) into the shuffler.

A chunk carries a `keys` array: one stable integer per row (the input line
number, or the row index for generated data).  The train/validation split
and the shuffle bucket are functions of (seed, key), so they do not depend
on how the input happened to be cut into chunks, nor on which lines were
skipped as malformed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class RatingsChunk:
    """(user, item, rating) rows with raw (not yet re-indexed) ids."""

    keys: np.ndarray  # int64
    users: np.ndarray  # int64 raw ids
    items: np.ndarray  # int64 raw ids
    ratings: np.ndarray  # float32

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def take(self, rows: np.ndarray) -> RatingsChunk:
        return RatingsChunk(self.keys[rows], self.users[rows], self.items[rows], self.ratings[rows])


@dataclass
class SparseChunk:
    """CSR rows of (feature index, raw value) pairs with 0/1 labels."""

    keys: np.ndarray  # int64
    labels: np.ndarray  # float32
    indptr: np.ndarray  # int64, len(keys) + 1
    indices: np.ndarray  # int32 (or int64 before a 'keep' check)
    values: np.ndarray  # float32

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def take(self, rows: np.ndarray) -> SparseChunk:
        """Select rows (bool mask or index array, in the given order)."""
        rows = np.flatnonzero(rows) if rows.dtype == bool else np.asarray(rows, dtype=np.int64)
        idx = csr_gather(self.indptr, rows)
        lengths = self.indptr[rows + 1] - self.indptr[rows]
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        return SparseChunk(self.keys[rows], self.labels[rows], indptr, self.indices[idx], self.values[idx])


def csr_gather(indptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Entry positions of the given CSR rows, concatenated in order (vectorised)."""
    starts = indptr[rows]
    lengths = indptr[rows + 1] - starts
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    out_starts = np.cumsum(lengths) - lengths
    return np.repeat(starts - out_starts, lengths) + np.arange(total, dtype=np.int64)


def concat_ratings(chunks: list[RatingsChunk]) -> RatingsChunk:
    return RatingsChunk(*(np.concatenate([getattr(c, f) for c in chunks]) for f in ("keys", "users", "items", "ratings")))


def concat_sparse(chunks: list[SparseChunk]) -> SparseChunk:
    lengths = np.concatenate([np.diff(c.indptr) for c in chunks])
    indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    return SparseChunk(
        np.concatenate([c.keys for c in chunks]),
        np.concatenate([c.labels for c in chunks]),
        indptr,
        np.concatenate([c.indices for c in chunks]),
        np.concatenate([c.values for c in chunks]),
    )
