"""Blocked matrix factorisation (DSGD, Gemulla et al., KDD 2011; LIBMF's FPSGD runs it across threads): rounds in
which no two workers touch the same row, so nothing needs merging inside a round.

With P live workers the users and the items are each split into P blocks of about as many ratings
(`mlless.data.user_shards.deal`; a skewed id space split by id alone leaves strata of unequal size, and a round's
H steps would sample the ratings of a large stratum less often than a small one's). The worker at index w of the
live set owns user block w; in round r it trains stratum (w, (w + r) mod P), the ratings of its users on item block
(w + r) mod P. In one round the P workers' strata share no user and no item, so the round's updates are disjoint,
and P consecutive rounds pass over every stratum once. A round is `spec.sync.localSteps` (H) steps; each step
trains one batch's worth of its stratum's ratings (the dataset's mean batch size), so the supervisor's cursor counts
epochs as under every other protocol. A stratum is cut into such pieces, each every n-th of its ratings, and read
in a shuffled order of them, reshuffled each time it wraps; a stratum smaller than a round's H
pieces is passed over more than once in that round.

Rounds are model averaging's (`averaging.py`, which this strategy extends): the workers publish what they changed
at a round's last step, wait for its close, and add their peers' changes as they are, since no two workers changed
the same row (averaging's mean over the workers that changed an entry would divide by one). As in DSGD, the rows
of a worker's own users stay at home: no peer trains them while the blocks stand, so a worker publishes only the
item rows it changed, and its users' rows stay pending in its accumulator (`RoundAccumulator.hold`). A replica is
still the shared state plus its own pending entries, so what needs the whole model assembles it from those:
an evaluation's snapshot adds every peer's pending entries to the donor's replica (`keeps_home`), the final model
adds every final replica's (`layouts.model_of`), a leaver's go to the survivors and a joiner starts from the shared
state. When the blocks change, rows a worker no longer owns are published at its next round's end, so their new
owner trains them one round stale, once.

Data placement: each worker reads the ratings of its user block alone, from the user shards `mlless prepare`
writes (`mlless.data.user_shards`: users are in 256 shards, dealt to the P blocks by their rating counts), and splits
them into its P strata (`BlockedFeed`). A data set prepared before there were shards, or more than 64 blocks, has
each worker read every batch instead and keep its block's (`EveryBatch`). A change of its index or of P (a scale-in, a join, a leaver) re-splits them at
the next round, which is where such a change takes effect (inside a round a worker reads no close). A worker
removed mid-round leaves its stratum's remaining pieces untrained in that round; its unsent changes are merged by
the survivors as under averaging. Only ratings data can be blocked: `spec.sync.protocol: blocked` is refused for
other models (`mlless.spec.schema.NEEDS`).
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from typing import Any

import numpy as np

from mlless.data.batches import Batch, RatingsBatch
from mlless.data.dataset import Dataset
from mlless.data.user_shards import MAX_BLOCKS, deal, shard_of
from mlless.runtime.striding import Feed
from mlless.runtime.sync import register
from mlless.runtime.sync.averaging import Averaging
from mlless.runtime.sync.base import WorkerHalf
from mlless.training.kernels import pmf as _pmf
from mlless.training.replica import StepResult


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
        users, items, values, ends = _pmf.pmf_strata(ratings.users, ratings.items, ratings.ratings,
                                                     home.view(np.uint8), item_block_of, blocks)
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


class BlockedHalf(WorkerHalf):
    """BSP's combine (a round's updates are disjoint: averaging's mean over carriers would only divide by one, at
    the cost of counting them and applying a zero correction); the rows of this worker's users stay at home."""

    feed: BlockedFeed

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held_for: tuple[int, int] | None = None  # the feed's layout the held rows were set for

    def train(self, batch: Batch, epoch: int, step: int, alone: bool) -> StepResult:
        if self.feed.layout != self.held_for:  # the feed re-split its strata for this step: new home users
            home = self.feed.home if self.feed.home is not None else np.zeros(0, dtype=bool)
            self.replica.filter.hold(self.replica.model.entries_of_users(home))
            self.held_for = self.feed.layout
        return super().train(batch, epoch, step, alone)


@register
class Blocked(Averaging):
    """Model averaging's rounds over disjoint strata: users and items in P blocks, item blocks rotating."""

    name = "blocked"
    worker_half = BlockedHalf
    keeps_home = True

    def feed(self, dataset: Dataset, seed: int, workers: int = 1, rank: int = 0) -> Feed:
        return BlockedFeed(dataset, seed, self.config.local_steps, workers, rank)
