"""Which mini-batch a worker trains on at a step, and reading it ahead of time.

Batches are consumed through a global cursor: at a step, the live workers in
rank order take consecutive cursor positions, so no batch is used twice in an
epoch whatever the worker count, and the stride follows scale-in and
scale-out. The cursor maps to a batch file through a seeded permutation per
epoch, reshuffled at each wrap as the original did.

`Feed` is what a worker asks for its step's batch: this shared order, read ahead. A protocol that places data
otherwise (blocked, `sync/protocols/blocked.py`) gives its strategy another feed; each cursor position stays one
batch's worth of samples, so the supervisor's epoch count holds under every protocol.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from mlless.data.batches import Batch
from mlless.data.dataset import Dataset


@dataclass(frozen=True)
class Schedule:
    n_batches: int
    seed: int

    def position(self, cursor: int, live: tuple[int, ...], rank: int, steps_ahead: int = 0) -> int:
        """Global cursor position of `rank` `steps_ahead` steps after the one `cursor` starts."""
        return cursor + steps_ahead * len(live) + live.index(rank)

    def epoch(self, position: int) -> int:
        return position // self.n_batches

    def progress(self, position: int, batches: int = 1) -> float:
        """The 1-based, fractional epoch halfway through the batch at `position` (through the `batches` from it: a
        step's union batch under gradient averaging): what the learning-rate schedule reads (`OptimizerConfig.lr_at`).
        Its integer part is `epoch(position) + 1`; the midpoint, rather than the batch's start, keeps a warm-up's
        first step from a rate of 0 and a cosine's last from 0 too."""
        return 1.0 + (position + batches / 2) / self.n_batches

    def batch_index(self, position: int) -> int:
        epoch, offset = divmod(position, self.n_batches)
        return int(_epoch_order(self.n_batches, self.seed, epoch)[offset])


@lru_cache(maxsize=4)
def _epoch_order(n_batches: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n_batches)


class Feed:
    """The mini-batch of each step: the batch file at the worker's cursor position, the next one read ahead."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.schedule = Schedule(dataset.n_batches, seed)
        self.prefetcher = Prefetcher(dataset)

    def take(self, position: int, step: int, live: tuple[int, ...], rank: int) -> Batch:
        """The batch worker `rank` trains at `step`, at cursor `position`, with `live` in the job."""
        batch = self.prefetcher.get(self.schedule.batch_index(position))
        self.prefetcher.hint(self.schedule.batch_index(position + len(live)))
        return batch

    def close(self) -> None:
        self.prefetcher.close()


class Prefetcher:
    """Reads the next mini-batch in a background thread while the current one trains (as Cirrus does)."""

    def __init__(self, dataset: Dataset) -> None:
        self._dataset = dataset
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
        self._pending: dict[int, Future[Batch]] = {}

    def hint(self, index: int) -> None:
        if index not in self._pending:
            self._pending[index] = self._pool.submit(self._dataset.batch, index)

    def get(self, index: int) -> Batch:
        self.hint(index)
        future = self._pending.pop(index)
        # A wrong guess (the worker set changed) is dropped rather than kept around.
        for stale in list(self._pending):
            self._pending.pop(stale).cancel()
        return future.result()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
