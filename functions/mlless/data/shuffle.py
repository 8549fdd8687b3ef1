"""External shuffle: spill rows into K bucket files, then shuffle each bucket in memory.

Sending every row to a uniformly random bucket and then permuting each
bucket uniformly yields a uniformly random permutation of all rows, while
only one bucket (plus a bounded write buffer) is ever in memory.  The bucket
of a row is a hash of (seed, row key), so the result depends only on the
input and the seed.

Memory bound: `flush_bytes` of buffered rows in pass 1, and one bucket of
about `target_bucket_bytes` (x ~3 for the permuted copy and the batch being
written) in pass 2.  With the defaults (64 MB each) a preparation stays
under a few hundred MB whatever the input size.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np

from mlless.data.chunks import RatingsChunk, SparseChunk, concat_ratings, concat_sparse

RATING_RECORD = np.dtype([("user", "<i8"), ("item", "<i8"), ("rating", "<f4")])
SPARSE_ROW = np.dtype([("label", "<f4"), ("nnz", "<i4")])
SPARSE_ENTRY = np.dtype([("index", "<i4"), ("value", "<f4")])

DEFAULT_FLUSH_BYTES = 64 << 20
DEFAULT_BUCKET_BYTES = 64 << 20


def choose_buckets(estimated_bytes: int, target_bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> int:
    """Enough buckets that each holds about `target_bucket_bytes` of spilled rows."""
    return int(min(4096, max(1, -(-estimated_bytes // target_bucket_bytes))))


class SpillBuckets:
    """Append-only bucket files of one row kind ("ratings" or "sparse") in a temp directory."""

    def __init__(self, directory: Path, name: str, kind: str, n_buckets: int, flush_bytes: int = DEFAULT_FLUSH_BYTES):
        self.dir = Path(directory)
        self.name = name
        self.kind = kind
        self.n_buckets = n_buckets
        self.flush_bytes = flush_bytes
        self._pending: list[tuple[RatingsChunk | SparseChunk, np.ndarray]] = []
        self._pending_bytes = 0
        self.rows = 0

    def _file(self, b: int, part: str) -> Path:
        return self.dir / f"{self.name}-{b:05d}.{part}"

    def add(self, chunk: RatingsChunk | SparseChunk, buckets: np.ndarray) -> None:
        if not len(chunk):
            return
        self._pending.append((chunk, buckets))
        self.rows += len(chunk)
        if self.kind == "ratings":
            self._pending_bytes += len(chunk) * RATING_RECORD.itemsize
        else:
            assert isinstance(chunk, SparseChunk)
            self._pending_bytes += len(chunk) * SPARSE_ROW.itemsize + len(chunk.indices) * SPARSE_ENTRY.itemsize
        if self._pending_bytes >= self.flush_bytes:
            self.flush()

    def flush(self) -> None:
        """Write buffered rows to their bucket files (one open per touched bucket)."""
        if not self._pending:
            return
        buckets = np.concatenate([b for _, b in self._pending])
        if self.kind == "ratings":
            chunk = concat_ratings([c for c, _ in self._pending])  # type: ignore[misc]
        else:
            chunk = concat_sparse([c for c, _ in self._pending])  # type: ignore[misc]
        self._pending, self._pending_bytes = [], 0
        order = np.argsort(buckets, kind="stable")
        edges = np.searchsorted(buckets[order], np.arange(self.n_buckets + 1))
        chunk = chunk.take(order)
        for b in np.flatnonzero(np.diff(edges)):
            lo, hi = int(edges[b]), int(edges[b + 1])
            if isinstance(chunk, RatingsChunk):
                rec = np.empty(hi - lo, dtype=RATING_RECORD)
                rec["user"], rec["item"], rec["rating"] = chunk.users[lo:hi], chunk.items[lo:hi], chunk.ratings[lo:hi]
                with open(self._file(b, "rows"), "ab") as f:
                    f.write(rec.tobytes())
            else:
                rows = np.empty(hi - lo, dtype=SPARSE_ROW)
                rows["label"] = chunk.labels[lo:hi]
                rows["nnz"] = np.diff(chunk.indptr[lo : hi + 1])
                a, z = int(chunk.indptr[lo]), int(chunk.indptr[hi])
                ent = np.empty(z - a, dtype=SPARSE_ENTRY)
                ent["index"], ent["value"] = chunk.indices[a:z], chunk.values[a:z]
                with open(self._file(b, "rows"), "ab") as f:
                    f.write(rows.tobytes())
                with open(self._file(b, "entries"), "ab") as f:
                    f.write(ent.tobytes())

    def load(self, b: int) -> RatingsChunk | SparseChunk:
        """Read one bucket back (rows in spill order); keys are row positions within the bucket."""
        path = self._file(b, "rows")
        if self.kind == "ratings":
            rec = np.fromfile(path, dtype=RATING_RECORD) if path.exists() else np.empty(0, RATING_RECORD)
            keys = np.arange(len(rec), dtype=np.int64)
            return RatingsChunk(keys, rec["user"].copy(), rec["item"].copy(), rec["rating"].copy())
        rows = np.fromfile(path, dtype=SPARSE_ROW) if path.exists() else np.empty(0, SPARSE_ROW)
        epath = self._file(b, "entries")
        ent = np.fromfile(epath, dtype=SPARSE_ENTRY) if epath.exists() else np.empty(0, SPARSE_ENTRY)
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(rows["nnz"], out=indptr[1:])
        return SparseChunk(np.arange(len(rows), dtype=np.int64), rows["label"].copy(), indptr, ent["index"].copy(), ent["value"].copy())

    def delete(self, b: int) -> None:
        for part in ("rows", "entries"):
            p = self._file(b, part)
            if p.exists():
                os.unlink(p)


def shuffled_batches(spill: SpillBuckets, batch_size: int, seed: int) -> Iterator[RatingsChunk | SparseChunk]:
    """Yield shuffled batches: all of exactly `batch_size` rows except possibly the last.

    The tail of each bucket is carried into the next one, so batch sizes do
    not depend on how rows fell into buckets.
    """
    spill.flush()
    concat = concat_ratings if spill.kind == "ratings" else concat_sparse
    carry: RatingsChunk | SparseChunk | None = None
    for b in range(spill.n_buckets):
        chunk = spill.load(b)
        spill.delete(b)
        if len(chunk):
            rng = np.random.default_rng([seed, 0x5348, b])
            chunk = chunk.take(rng.permutation(len(chunk)))
        if carry is not None and len(carry):
            chunk = concat([carry, chunk])  # type: ignore[list-item]
        n_full = len(chunk) // batch_size
        for j in range(n_full):
            yield chunk.take(np.arange(j * batch_size, (j + 1) * batch_size))
        carry = chunk.take(np.arange(n_full * batch_size, len(chunk)))
    if carry is not None and len(carry):
        yield carry
