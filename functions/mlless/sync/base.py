"""The interface every synchronisation protocol implements: a strategy and its worker half.

Every protocol runs the same loops (`runtime/worker.py`, `runtime/supervisor/loop.py`): a worker trains a step,
publishes what its protocol shares, reports, and at each step-close applies what its protocol reads; the
supervisor closes a step once every live worker has reported it. What differs is asked of the strategy, never of a
protocol's name:

* `SyncStrategy`: the replica's significance threshold, how many closed steps a worker may run ahead of, which
  steps end with a publication (and so which closes the supervisor broadcasts), where a step's update is written,
  the exchange pattern `spec.sync.exchange` names (who reads what, `sync/exchanges/base.py`), which mini-batches a
  worker trains (its feed, `data/feed.py`), and the model its final replicas make;
* `WorkerHalf`: a local step, then publish what it selected; at a close, gather the peers' updates and combine them
  into the replica; once out of the job or at its end, take back what no peer will apply.

A protocol is one module that subclasses what it changes and registers its strategy (`sync/__init__.py`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar, Sequence

import numpy as np

from mlless.data.batches import Batch
from mlless.data.dataset import Dataset
from mlless.protocol import keys, layouts
from mlless.protocol.framing import FrameError
from mlless.protocol.messages import Close, Update
from mlless.protocol.precision import precision
from mlless.data.feed import Feed
from mlless.sync.aggregation import aggregation
from mlless.sync.exchanges.base import EXCHANGES, Exchange
from mlless.spec.registry import Registry
from mlless.spec.job import SyncConfig
from mlless.training.models import Model
from mlless.training.replica import Accumulator, Replica, StepResult, TrainingDiverged
from mlless.transport import Transport


class WorkerHalf:
    """What a worker does for its protocol: publish after a local step, combine the peers' updates at a close."""

    #: Whether `combine` counts the updates that carry each entry (model averaging divides by them); a merging
    #: exchange then hands them on as zero-valued updates (`sync/exchanges/reduce.py`), which a sum does not need.
    counts_carriers: ClassVar[bool] = False

    def __init__(self, strategy: SyncStrategy, rank: int, replica: Replica, exchange: Exchange, feed: Feed) -> None:
        self.strategy = strategy
        self.rank = rank
        self.replica = replica
        self.exchange = exchange
        self.feed = feed
        #: What the frames' values travel in (`spec.sync.precision`).
        self.precision = precision(exchange.precision)

    def train(self, batch: Batch, epoch: float, step: int, alone: bool) -> StepResult:
        """Train `step` on `batch`, selecting what the protocol shares after it.

        Alone in the job, nobody needs this update, so it is not shared.
        """
        return self.replica.step(batch, epoch, step, share=not alone, select=self.strategy.publishes(step))

    def publish(self, step: int, result: StepResult) -> int:
        """Share what `train` selected, if anything; returns the bytes written.

        The values go out rounded to the job's precision, and every replica applies them so, this one too (its
        frames in the exchange's outbox hold them): what rounding left out is not shared, so it is this replica's
        pending update again, sent with a later one.
        """
        if not len(result.indices):
            return 0
        sent = self.wire(result.values)
        if not self.precision.exact:
            left = result.values - sent
            kept = left != 0
            if kept.any():
                self.replica.unpublish(result.indices[kept], left[kept])
        return self.exchange.publish(step, result.indices, sent)

    def hold(self, step: int, honest: StepResult, published: StepResult) -> None:
        """Hold `published` as what this replica shares for `step` instead of the `honest` result `train` returned (a
        Byzantine worker's, runtime/attack.py), so that the replicas stay consistent: a replica that applied its
        own update moves by the difference."""
        if len(honest.indices):
            self.replica.apply(honest.indices, published.values - honest.values)

    def wire(self, values: np.ndarray) -> np.ndarray:
        """`values` as the job's frames carry them; TrainingDiverged if one is beyond the precision's range."""
        try:
            return self.precision.rounded(values)
        except FrameError as exc:
            raise TrainingDiverged(f"the shared {exc}: lower spec.optimizer.learningRate, or set "
                                   "spec.sync.precision bfloat16") from None

    def gather(self, close: Close) -> list[Update]:
        """The peers' updates `close` names, read as the exchange pattern says."""
        return self.exchange.gather(close)

    def combine(self, close: Close, updates: list[Update]) -> None:
        """Add the gathered updates to the replica: replicas stay the shared state plus their own unsent updates."""
        for update in updates:
            try:
                self.replica.apply(update.indices, update.values)
            except ValueError as exc:
                self.exchange.reject(f"update frame of worker {update.sender} for step {close.step}: {exc}")

    def withdraw_unread(self, after: int) -> None:
        """The close of step `after` took this worker out of the job, or ended the job: what it published for later
        steps no peer applies, so it goes back to the accumulator (a leaver's the survivors merge,
        `Worker._merge_leavers`; a final replica's counts as unsent)."""
        for published in self.exchange.unread(after):
            self.replica.unpublish(published.indices, published.values)


@dataclass(frozen=True)
class SyncStrategy(ABC):
    """A protocol's answers, from its `spec.sync` section; `name` is what `spec.sync.protocol` calls it."""

    config: SyncConfig

    name: ClassVar[str]
    #: The class of its worker half, for a protocol that changes what a worker does.
    worker_half: ClassVar[type[WorkerHalf]] = WorkerHalf
    #: Whether replicas keep entries unsent for many rounds (blocked's home rows): an evaluation's snapshot is then
    #: the donor's replica plus every peer's pending entries, not the donor's replica alone.
    keeps_home: ClassVar[bool] = False
    #: Whether each worker's published update is added in full to every replica (bsp, isp, ssp), so that P workers'
    #: steps move the shared state P-fold, or averaged (`averaging.py` and its rounds): `Replica.workers`, which the
    #: models' steps that share a move among summed replicas read (normalized updates, k-means's rates), is then 1.
    sums_updates: ClassVar[bool] = True
    #: Whether every replica steps its own optimizer by the same shared gradient (gradients.py), so that replicas stay
    #: equal only with equal optimizer states: a joiner then starts from its donor's optimizer state too.
    share_optimizer: ClassVar[bool] = False

    @property
    @abstractmethod
    def threshold(self) -> float:
        """The significance filter's v for the replicas."""

    @property
    @abstractmethod
    def staleness(self) -> int:
        """How many closed steps a worker may run ahead of."""

    def must_have_closed(self, step: int) -> int:
        """The step whose close a worker that has trained `step` steps awaits before it trains the next one.

        Step 0's close carries the worker set, so no one may start before it.
        """
        return max(step - self.staleness, 0)

    def publishes(self, step: int) -> bool:
        """Whether `step` ends with every worker selecting and publishing what it has accumulated. The supervisor
        broadcasts such a step's close though it carries no news (no flag, no change of the worker set, no merge):
        a close the workers' loop does not wait for (`must_have_closed`) and that names no update is counted,
        evaluated and checked by the supervisor alone. Every step publishes under BSP, ISP and SSP."""
        return True

    def update_key(self, rank: int, step: int) -> str:
        """Where `rank` publishes its update of `step`: slots are reused once no worker can still read them."""
        return keys.update(rank, step, self.staleness)

    @property
    def slots(self) -> int:
        """How many of a worker's frames are readable at once (`update_key`'s ring)."""
        return keys.update_slots(self.staleness)

    def snapshot_peers(self, live: tuple[int, ...], before: tuple[int, ...]) -> tuple[int, ...]:
        """Whose pending entries an evaluation's snapshot adds to its donor's replica, at a close naming `live` after
        one naming `before`: under a protocol that keeps rows at home, every worker already in the job (a joiner
        holds nothing back; the supervisor leaves out the donor), else nobody."""
        return tuple(r for r in live if r in before) if self.keeps_home else ()

    def merge_final_replicas(self, replicas: Sequence[layouts.Arrays]) -> np.ndarray:
        """The model a job's final replicas hand back: their mean, a model of the kind its evaluations scored (an
        evaluation's snapshot is the donor's replica alone): adding every replica's pending entries in full
        (`layouts.model_of`, the state a resumed job continues from) scored worse. A protocol that keeps rows at
        home needs them: its home rows are pending on their owner alone."""
        return layouts.model_of(replicas) if self.keeps_home else layouts.mean_of(replicas)

    def worker(self, rank: int, replica: Replica, transport: Transport, patience: float,
               reject: Callable[[str], None], feed: Feed, workers: int = 1) -> WorkerHalf:
        """The worker `rank`'s half, over `replica` trained on `feed`; `reject` counts and logs a frame that cannot
        be applied, and a frame the store lost is waited for `patience` seconds; `workers`: the job's (a pattern's
        partitions)."""
        exchange = EXCHANGES.named(self.config.exchange)(transport, rank, self.update_key, self.slots, patience, reject,
                                                   size=replica.params.shape[0], parts=workers,
                                                   carriers=self.worker_half.counts_carriers,
                                                   aggregation=aggregation(self.config.aggregation, self.config.trim),
                                                   precision=self.config.precision)
        return self.worker_half(self, rank, replica, exchange, feed)

    def accumulator(self, model: Model) -> Accumulator | None:
        """What keeps a replica's unsent updates, over `model.params`; None: the significance filter at `threshold`."""
        return None

    def feed(self, dataset: Dataset, seed: int, workers: int = 1, rank: int = 0) -> Feed:
        """Where the mini-batches of worker `rank` come from, in a job started with `workers`: by default the job's
        shared shuffled order (`data/feed.py`)."""
        return Feed(dataset, seed)


#: Every strategy by the name `spec.sync.protocol` gives it; `mlless.sync` imports the built-in ones.
STRATEGIES: Registry[type[SyncStrategy]] = Registry("sync strategy", "sync.protocol")
register = STRATEGIES.register
