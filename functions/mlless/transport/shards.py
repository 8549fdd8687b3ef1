"""Redis sharding: a job's keys spread over N Redis instances (`spec.redis.shards`), each a `JobStore`.

MLES (journal extension of MLLess, §6.5) measured two Redis instances 1.4x faster than one at 64 workers: one
instance's link and event loop carry every worker's frames. Sharding splits that traffic.

Which shard holds a key (`ShardMap`), the one rule, in one place:

- a key `KIND:N:...` whose second field is a number N (a worker's rank, a partition, a block of rows) lives on
  shard N mod S: worker r's update slots (`update:r:slot`, and ScatterReduce's `update:r:slot:part`), checkpoint,
  final and leaver replicas and pending snapshot entries, partition p's merged frame (`reduced:p:...`), rows block b;
- every other key (`snapshot`, `job-state`, `job-checkpoint`) lives on shard 0.

Why by owner and not by a hash of the whole name: with P a multiple of S every shard carries exactly P/S workers'
frames at every step (a hash balances only on average, and a worker's slots would move between shards as the ring
turns); a worker writes only to its home shard; and a job-level key that a successor supervisor reads with another
(`job-state` with `job-checkpoint`) stays in one round trip. Keys are named in `mlless.protocol.keys`.

Repair. Each shard keeps its own `_alive` marks (`mlless.transport.store`): a shard that restarted without
persistence is noticed by the first call that reaches it, and `epoch` (the sum of the shards') goes up, so the
process re-publishes its frames (all of them: the ones on other shards are written again unchanged). A call
reaches only the shards of its keys, so a worker whose own shard lost its frames, while it reads its peers' from
others, notices at its next write, or at its next `probe` (every shard; runtime/worker.py probes while it waits
for a step-close), not at its next read as with one Redis; its waiting peers wait for the frame meanwhile
(sync/exchanges/base.py, `fetch`). Probing every shard on every read would notice sooner, at one more command
per shard per read on the hot path.

Reads fan out: `get_many` sends one pipelined round trip to each shard it reads from, concurrently (the calling
thread and one pool thread per further shard), so a read over S shards takes about the slowest shard's time, not
the sum.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

from mlless.protocol.keys import number as key_number

from .store import JobStore

__all__ = ["ShardMap", "ShardedStore"]

T = TypeVar("T")


@dataclass(frozen=True)
class ShardMap:
    """Which of `shards` Redis instances holds a key (the rule is in the module docstring)."""

    shards: int

    def shard(self, key: str) -> int:
        n = key_number(key)
        return 0 if n is None else n % self.shards


class ShardedStore:
    """A job's keys over several `JobStore`s, one per shard; the same calls as one `JobStore` makes."""

    def __init__(self, stores: Sequence[JobStore]) -> None:
        self.stores = list(stores)
        self.map = ShardMap(len(self.stores))
        self.desc = " ".join(s.desc for s in self.stores)
        self._pool = ThreadPoolExecutor(max_workers=max(len(self.stores) - 1, 1), thread_name_prefix="mlless-shard")

    @property
    def epoch(self) -> int:
        """How many times any shard was found to have lost the job's keys."""
        return sum(s.epoch for s in self.stores)

    @property
    def reconnected_at(self) -> float:
        return max(s.reconnected_at for s in self.stores)

    def _each(self, calls: Sequence[Callable[[], T]]) -> list[T]:
        """Run `calls` concurrently: the first in this thread, each other in one of the pool's (a hand-off less on
        a busy CPU); every one finishes before the first error is raised."""
        futures = [self._pool.submit(c) for c in calls[1:]]
        try:
            first, error = calls[0](), None
        except Exception as exc:  # raised below, once the others are done too
            first, error = None, exc
        errors = [error, *(f.exception() for f in futures)]
        for e in errors:
            if e is not None:
                raise e
        return [first, *(f.result() for f in futures)]  # type: ignore[list-item]

    def connect(self, window: float) -> None:
        self._each([lambda s=s: s.connect(window) for s in self.stores])

    def probe(self) -> None:
        self._each([s.probe for s in self.stores])

    def put(self, key: str, value: bytes, ttl: int) -> None:
        self.stores[self.map.shard(key)].put(key, value, ttl)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values under `keys`: one round trip to each shard that holds some, all of them at once."""
        at: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            at.setdefault(self.map.shard(key), []).append(i)
        values: list[bytes | None] = [None] * len(keys)
        reads = [lambda s=s, ids=ids: self.stores[s].get_many([keys[i] for i in ids]) for s, ids in at.items()]
        for ids, got in zip(at.values(), self._each(reads) if reads else []):
            for i, value in zip(ids, got):
                values[i] = value
        return values

    def delete_job(self) -> tuple[int, list[int]]:
        done = self._each([s.delete_job for s in self.stores])
        return sum(d for d, _ in done), sorted({r for _, ranks in done for r in ranks})

    def reset(self) -> list[int]:
        return sorted({r for ranks in self._each([s.reset for s in self.stores]) for r in ranks})

    def close(self) -> None:
        for store in self.stores:
            store.close()
        self._pool.shutdown(wait=False)
