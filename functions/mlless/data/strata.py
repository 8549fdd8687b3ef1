"""DSGD's data placement (`spec.sync.protocol: blocked`, `mlless.sync.protocols.blocked`): which ratings a worker
trains at each step of a round.

With P live workers the users and the items are each split into P blocks of about as many ratings; the worker at
index w of the live set owns user block w, and in round r trains stratum (w, (w + r) mod P). A round is H steps,
each one batch's worth of its stratum's ratings, taken as every n-th rating from a shuffled start.

Each worker reads the ratings of its user block alone, from the user shards `mlless prepare` writes
(`mlless.data.user_shards`: users are in 256 shards, dealt to the P blocks by their rating counts), and splits them
into its P strata (`BlockedFeed`). A data set prepared before there were shards, or more than 64 blocks, has each
worker read every batch instead and keep its block's (`EveryBatch`). A change of its index or of P (a scale-in, a
join, a leaver) re-splits them at the next round, which is where such a change takes effect (inside a round a worker reads no close). A worker
removed mid-round leaves its stratum's remaining pieces untrained in that round; its unsent changes are merged by
the survivors as under averaging.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache

import numpy as np

from mlless.data.batches import Batch, RatingsBatch
from mlless.data.dataset import Dataset
from mlless.data.feed import Feed
from mlless.data.kernels import strata as _kernel
from mlless.data.user_shards import MAX_BLOCKS, deal, shard_of


class BlockedFeed(Feed):
    """The pieces of the stratum a worker trains at each step, from its user block's ratings; alone in the job, the
    batch files in the job's shared order (`Feed`), as under any other protocol."""

    def __init__(self, dataset: Dataset, seed: int, local_steps: int, workers: int = 1, rank: int = 0) -> None:
        super().__init__(dataset, seed)
        if dataset.kind != "ratings":
            raise ValueError(f"spec.sync.protocol: blocked needs ratings data, {dataset.uri} holds {dataset.kind}")
        self.dataset = dataset
        self.seed = seed
        self.local_steps = local_steps
        self.piece = max(1, round(dataset.manifest.n_train / dataset.n_batches))
        self.layout: tuple[int, int] | None = None  # (P, w) the strata were split for
        self.strata: list[RatingsBatch] = []
        self.home: np.ndarray | None = None  # over user ids: this worker's user block, None alone in the job
        self.placement = placement(dataset)
        # The first block's ratings are read in the background from the start when the job starts with peers,
        # while the worker says hello (the worker at index `rank` of ranks 0 .. P - 1). Training the shared order
        # meanwhile was slower: the round's exchange carried every row it touched.
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="blocked-read")
        self._prefetched: tuple[tuple[int, int], Future[Block]] | None = None
        if 1 < workers and rank < workers:
            self._prefetched = ((workers, rank), self._reader.submit(self.placement.block, workers, rank))

    def take(self, position: int, step: int, live: tuple[int, ...], rank: int) -> Batch:
        blocks, block = len(live), live.index(rank)
        if self.layout != (blocks, block):
            self.strata, self.home = self._split(blocks, block) if blocks > 1 else ([], None)
            self.layout = (blocks, block)
        if blocks == 1:
            return super().take(position, step, live, rank)
        round_, local = divmod(step - 1, self.local_steps)
        item_block = (block + round_) % blocks
        stratum = self.strata[item_block]
        pieces = max(1, -(-len(stratum) // self.piece))
        # This stratum's visits are every P-th round: the piece counter runs on across them.
        wrap, piece = divmod((round_ // blocks) * self.local_steps + local, pieces)
        # Piece k is every `pieces`-th rating from the k-th: the stratum is its user shards one after the other (each
        # in a shuffled order), and a contiguous run of it would hold the users of one shard alone.
        ratings = slice(int(_piece_order(pieces, self.seed, blocks, block, item_block, wrap)[piece]), None, pieces)
        return RatingsBatch(*(np.ascontiguousarray(a[ratings]) for a in (stratum.users, stratum.items, stratum.ratings)))

    def close(self) -> None:
        super().close()
        self._reader.shutdown(wait=False, cancel_futures=True)

    def _split(self, blocks: int, block: int) -> tuple[list[RatingsBatch], np.ndarray]:
        """The ratings of user block `block` of `blocks`, by item block, each in the order of the batch files
        (`mlless prepare` shuffled the ratings into them; the pieces are taken in a shuffled order), and the block's
        users (a mask over user ids)."""
        prefetched, self._prefetched = self._prefetched, None
        found = prefetched[1].result() if prefetched is not None else None  # the placement is not for two threads
        if prefetched is None or prefetched[0] != (blocks, block):
            found = self.placement.block(blocks, block)
        assert found is not None
        ratings, home, item_block_of = found
        users, items, values, ends = _kernel.strata(ratings.users, ratings.items, ratings.ratings, home.view(np.uint8),
                                                     item_block_of, blocks)
        starts = np.concatenate([[0], ends[:-1]])
        strata = [RatingsBatch(users[a:b], items[a:b], values[a:b]) for a, b in zip(starts, ends)]
        return strata, home


#: A user block's ratings (or more: the strata keep the block's users' alone), the block's users as a mask over user
#: ids, and each item id's block.
Block = tuple[RatingsBatch, np.ndarray, np.ndarray]


def placement(dataset: Dataset) -> EveryBatch:
    """Where a worker's user block comes from: the user shards `mlless prepare` writes, or, in a data set prepared
    before there were any, every batch."""
    return ByUserShard(dataset) if dataset.manifest.user_shards else EveryBatch(dataset)


class EveryBatch:
    """Every training batch, read once; users and items are dealt to blocks by their counts. Every worker reads the
    same ratings, so every worker computes the same blocks."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self._every: RatingsBatch | None = None

    def block(self, blocks: int, block: int) -> Block:
        if self._every is None:
            batches = [self.dataset.batch(i) for i in range(self.dataset.n_batches)]
            self._every = _concatenated(batches)
        n_users, n_items = self.dataset.manifest.n_users or 0, self.dataset.manifest.n_items or 0
        home = deal(np.bincount(self._every.users, minlength=n_users), blocks) == block
        return self._every, home, deal(np.bincount(self._every.items, minlength=n_items), blocks)


class ByUserShard(EveryBatch):
    """The user shards of the block's users alone (`mlless.data.user_shards`): shards are dealt to user blocks by
    their counts, items to item blocks by theirs. With more than `MAX_BLOCKS` blocks, every batch."""

    def __init__(self, dataset: Dataset) -> None:
        super().__init__(dataset)
        self._counts: tuple[np.ndarray, np.ndarray] | None = None
        self._shards: dict[int, RatingsBatch] = {}  # those read so far: a change of blocks may need others

    def block(self, blocks: int, block: int) -> Block:
        if blocks > MAX_BLOCKS:
            return super().block(blocks, block)
        if self._counts is None:
            self._counts = self.dataset.user_counts()
        shard_rows, item_counts = self._counts
        mine = np.flatnonzero(deal(shard_rows, blocks) == block)
        for s in mine:
            if s not in self._shards:
                self._shards[s] = self.dataset.user_shard(int(s), int(shard_rows[s]))
        home = np.isin(shard_of(np.arange(self.dataset.manifest.n_users or 0)), mine)
        return _concatenated([self._shards[s] for s in mine]), home, deal(item_counts, blocks)


def _concatenated(batches: list[RatingsBatch]) -> RatingsBatch:
    return RatingsBatch(*(np.concatenate([getattr(b, name) for b in batches]) for name in ("users", "items", "ratings")))


@lru_cache(maxsize=8)
def _piece_order(pieces: int, seed: int, blocks: int, block: int, item_block: int, wrap: int) -> np.ndarray:
    return np.random.default_rng([seed, blocks, block, item_block, wrap]).permutation(pieces)
