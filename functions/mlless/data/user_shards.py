"""Training ratings by user shard: what lets a worker of `spec.sync.protocol: blocked` read its user block alone.

Under blocked (sync/protocols/blocked.py) a worker trains only the ratings of its block of users. Read from the
training batches, that means every worker reads every batch and keeps 1/P of them, paying every batch file's
overhead before its first step.

So `mlless prepare` also writes the training ratings of a ratings set grouped by user: user u belongs to shard
`shard_of(u)` of `USER_SHARDS` (a multiplicative hash of its id, so that popular and unpopular users mix in
every shard), and `users/shard-NNN.npz` holds that shard's ratings in the order of the batch files, which
`prepare` shuffled. `users/counts.npz` holds each shard's rating count and each item's, from which every worker
computes the same blocks without reading any rating: shards are dealt to P user blocks by their counts, items to
P item blocks by theirs (`deal`). Each file has its sha256 in the manifest, like the batches.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mlless.data.batches import RatingsBatch
from mlless.data.chunks import RatingsChunk
from mlless.data.manifest import USER_COUNTS_NAME, user_shard_name
from mlless.data.npz import npz_bytes
from mlless.data.output import OutputDir
from mlless.data.shuffle import SpillBuckets

#: Shards of the users (a power of two). Dealt to P <= 64 blocks (`MAX_BLOCKS`), each block gets 4 or more shards;
#: on the 10M skewed ratings the user blocks' sizes differed by at most 2.5 % at P = 2-4, where dealing the users
#: themselves by count left the strata as unequal (their sizes are set by the most popular items).
USER_SHARDS = 256
MAX_BLOCKS = USER_SHARDS // 4
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: Fibonacci hashing (Knuth, TAOCP 6.4)
_SHIFT = np.uint64(64 - (USER_SHARDS - 1).bit_length())  # the top log2(USER_SHARDS) bits


def shard_of(users: np.ndarray) -> np.ndarray:
    """Each (dense) user id's shard: the top bits of its Fibonacci hash."""
    return ((np.asarray(users).astype(np.uint64) * _GOLDEN) >> _SHIFT).astype(np.int64)


def deal(counts: np.ndarray, blocks: int) -> np.ndarray:
    """Each entry's block, so that the blocks hold about as much of `counts`: entries by count, most first, dealt
    to the blocks back and forth (0, 1, ..., P - 1, P - 1, ..., 0, ...)."""
    order = np.argsort(-np.asarray(counts), kind="stable")
    lap = np.arange(len(order)) % (2 * blocks)
    assigned = np.empty(len(order), dtype=np.int64)
    assigned[order] = np.where(lap < blocks, lap, 2 * blocks - 1 - lap)
    return assigned


class UserShardWriter:
    """Collects `prepare`'s training batches by user shard (spilled to `directory`), then writes the shards."""

    def __init__(self, directory: Path, n_items: int, flush_bytes: int) -> None:
        self.spill = SpillBuckets(directory, "users", "ratings", USER_SHARDS, flush_bytes=flush_bytes)
        self.item_counts = np.zeros(n_items, dtype=np.int64)

    def add(self, batch: RatingsBatch) -> None:
        users = batch.users.astype(np.int64)
        self.spill.add(RatingsChunk(np.arange(len(batch), dtype=np.int64), users, batch.items.astype(np.int64),
                                    batch.ratings), shard_of(users))
        self.item_counts += np.bincount(batch.items, minlength=len(self.item_counts))

    def write(self, output: OutputDir) -> None:
        self.spill.flush()
        rows = np.zeros(USER_SHARDS, dtype=np.int64)
        for s in range(USER_SHARDS):
            chunk = self.spill.load(s)
            self.spill.delete(s)
            rows[s] = len(chunk)
            output.put(user_shard_name(s), npz_bytes(RatingsBatch(chunk.users.astype(np.int32), chunk.items.astype(np.int32),
                                                             chunk.ratings).arrays()))
        output.put(USER_COUNTS_NAME, npz_bytes({"shard_rows": rows, "item_counts": self.item_counts}))
