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

Which ratings a worker reads and trains at each step is `mlless.data.strata`'s. Only ratings data can be blocked:
`spec.sync.protocol: blocked` is refused for other models (`mlless.spec.pairings.NEEDS`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from mlless.data.batches import Batch
from mlless.data.dataset import Dataset
from mlless.data.feed import Feed
from mlless.data.strata import BlockedFeed
from mlless.sync.base import WorkerHalf, register
from mlless.sync.protocols.averaging import Averaging
from mlless.training.replica import StepResult


class BlockedHalf(WorkerHalf):
    """BSP's combine (a round's updates are disjoint: averaging's mean over carriers would only divide by one, at
    the cost of counting them and applying a zero correction); the rows of this worker's users stay at home."""

    feed: BlockedFeed

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held_for: tuple[int, int] | None = None  # the feed's layout the held rows were set for

    def train(self, batch: Batch, epoch: float, step: int, alone: bool) -> StepResult:
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
