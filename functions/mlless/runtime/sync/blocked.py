"""Blocked matrix factorisation (DSGD, Gemulla et al., KDD 2011; LIBMF's FPSGD runs it across threads): rounds in
which no two workers touch the same row, so nothing needs merging inside a round.

With P live workers the users and the items are each split into P blocks of about as many ratings
(`balanced_blocks`). The worker at index w of the
live set owns user block w; in round r it trains stratum (w, (w + r) mod P), the ratings of its users on item block
(w + r) mod P. In one round the P workers' strata share no user and no item, so the round's updates are disjoint,
and P consecutive rounds pass over every stratum once. A round is `spec.sync.localSteps` (H) steps; each step
trains one batch's worth of its stratum's ratings (the dataset's mean batch size), so the supervisor's cursor counts
epochs as under every other protocol. A stratum keeps the order of the batch files, which `mlless prepare` shuffled,
and is read in a shuffled order of such pieces, reshuffled each time it wraps; a stratum smaller than a round's H
pieces is passed over more than once in that round.

Rounds are model averaging's (`averaging.py`, which this strategy extends): the workers publish what they changed
at a round's last step, wait for its close, and add their peers' changes as they are, since no two workers changed
the same row (averaging's mean over the workers that changed an entry would divide by one). Unlike
DSGD, user rows are published once per round too: every replica stays the shared model, which evaluation,
checkpoints, failover, joins and scale-in rely on. That costs each worker its touched user rows once per round,
against averaging's touched users and items (the popular items every round, by every worker).

Data placement: each worker reads the training batches once, keeps the ratings of its user block and splits them
into its P strata (`BlockedFeed`); a change of its index or of P (a scale-in, a join, a leaver) re-splits them at
the next round, which is where such a change takes effect (inside a round a worker reads no close). A worker
removed mid-round leaves its stratum's remaining pieces untrained in that round; its unsent changes are merged by
the survivors as under averaging. Only ratings data can be blocked: `spec.sync.protocol: blocked` is refused for
other models (`mlless.spec.schema.PAIRINGS`).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from mlless.data.batches import Batch, RatingsBatch
from mlless.data.dataset import Dataset
from mlless.runtime.striding import Feed
from mlless.runtime.sync import register
from mlless.runtime.sync.averaging import Averaging
from mlless.runtime.sync.base import WorkerHalf


class BlockedFeed(Feed):
    """The pieces of the stratum a worker trains at each step, from its user block's ratings."""

    def __init__(self, dataset: Dataset, seed: int, local_steps: int) -> None:
        super().__init__(dataset, seed)
        self.dataset = dataset
        self.seed = seed
        self.local_steps = local_steps
        self.piece = max(1, round(dataset.manifest.n_train / dataset.n_batches))
        self.layout: tuple[int, int] | None = None  # (P, w) the strata were split for
        self.strata: list[RatingsBatch] = []

    def take(self, position: int, step: int, live: tuple[int, ...], rank: int) -> Batch:
        blocks, block = len(live), live.index(rank)
        if self.layout != (blocks, block):
            self.strata = self._split(blocks, block)
            self.layout = (blocks, block)
        round_, local = divmod(step - 1, self.local_steps)
        item_block = (block + round_) % blocks
        stratum = self.strata[item_block]
        pieces = max(1, -(-len(stratum) // self.piece))
        # This stratum's visits are every P-th round: the piece counter runs on across them.
        wrap, piece = divmod((round_ // blocks) * self.local_steps + local, pieces)
        start = int(_piece_order(pieces, self.seed, blocks, block, item_block, wrap)[piece]) * self.piece
        end = start + self.piece
        return RatingsBatch(stratum.users[start:end], stratum.items[start:end], stratum.ratings[start:end])

    def _split(self, blocks: int, block: int) -> list[RatingsBatch]:
        """The ratings of user block `block` of `blocks`, by item block, each in the order of the batch files
        (`mlless prepare` shuffled the ratings into them; the pieces are taken in a shuffled order)."""
        if self.dataset.kind != "ratings":
            raise ValueError(f"spec.sync.protocol: blocked needs ratings data, {self.dataset.uri} holds {self.dataset.kind}")
        batches = [self.dataset.batch(i) for i in range(self.dataset.n_batches)]
        users, items, ratings = (np.concatenate([getattr(b, name) for b in batches]) for name in ("users", "items", "ratings"))
        if blocks == 1:
            return [RatingsBatch(users, items, ratings)]
        item_block_of = balanced_blocks(items, blocks)  # over every rating, as every worker computes it
        mine = balanced_blocks(users, blocks)[users] == block
        users, items, ratings = users[mine], items[mine], ratings[mine]
        item_blocks = item_block_of[items]
        strata = []
        for item_block in range(blocks):
            rows = item_blocks == item_block
            strata.append(RatingsBatch(users[rows], items[rows], ratings[rows]))
        return strata


def balanced_blocks(ids: np.ndarray, blocks: int) -> np.ndarray:
    """Each id's block, so that the blocks hold about as many of `ids`' occurrences: ids by count, most first, dealt
    to the blocks back and forth (0, 1, ..., P - 1, P - 1, ..., 0, ...). A skewed id space (Zipf users and items)
    split by id alone leaves strata of unequal size, and a round's H steps would sample the ratings of a large
    stratum less often than a small one's. Every worker reads the same ratings, so every worker computes the same
    blocks."""
    counts = np.bincount(ids)
    order = np.argsort(-counts, kind="stable")
    lap = np.arange(len(order)) % (2 * blocks)
    assigned = np.empty(len(order), dtype=np.int64)
    assigned[order] = np.where(lap < blocks, lap, 2 * blocks - 1 - lap)
    return assigned


@lru_cache(maxsize=8)
def _piece_order(pieces: int, seed: int, blocks: int, block: int, item_block: int, wrap: int) -> np.ndarray:
    return np.random.default_rng([seed, blocks, block, item_block, wrap]).permutation(pieces)


@register
class Blocked(Averaging):
    """Model averaging's rounds over disjoint strata: users and items in P blocks, item blocks rotating."""

    name = "blocked"
    # A round's updates are disjoint, so the peers' are added as they are (BSP's combine): averaging's mean over
    # carriers would only divide by one, at the cost of counting them and applying a zero correction.
    worker_half = WorkerHalf

    def feed(self, dataset: Dataset, seed: int) -> Feed:
        return BlockedFeed(dataset, seed, self.config.local_steps)
