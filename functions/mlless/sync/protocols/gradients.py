"""Gradient averaging (LambdaML's GA-SGD): every step the workers exchange their mini-batch gradients, and every
replica takes one optimizer step by their mean.

A worker computes its batch's mean gradient at the shared parameters and publishes it without applying it
(`Replica.gradient`). At the step's close it reads its peers' gradients as the exchange pattern says (all-to-all,
allreduce, scatter-reduce or in-store), adds its own, divides by the n senders the close names, and steps its
optimizer by that mean (`Replica.descend`), at the learning rate of the step's union batch. Every replica starts
equal, applies the same mean at the same rate with the same optimizer state, and so stays equal: the job trains as one network on a global batch P times a worker's, which is
what PyTorch's DistributedDataParallel computes. Under bsp a worker's Adam step is added in full to every replica,
so P workers move the network P-fold and with P different Adam states; on the digits (examples/digits-cnn.yaml)
that cost about a point of validation accuracy at P = 2.

A robust rule (`spec.sync.aggregation`) replaces the sum of the n gradients by n times its centre (median,
trimmed mean, Multi-Krum), as it does for updates: the mean is then the rule's centre.

Nothing is ever pending: a replica is the shared state. A leaver hands on nothing, and what it published for a step
no one closed is dropped (its gradient was never applied). A joiner starts from a donor's parameters and its
optimizer's state (`SyncStrategy.share_optimizer`); a worker's checkpoint carries its optimizer's state as under
every protocol, and the job's checkpoint (a suspend, a supervisor's successor) the state its replicas share. The per-sample rules (adagrad, normalized) and a model's own rule update inside the batch and
publish no gradient: the schema refuses them with this protocol (`mlless.spec.pairings.MINI_BATCH_PROTOCOLS`).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from mlless.data.batches import Batch
from mlless.protocol.messages import Close, Update
from mlless.sync.base import WorkerHalf, register
from mlless.sync.protocols.bsp import Bsp
from mlless.sync.sums import mean_update
from mlless.training.replica import StepResult


class GradientHalf(WorkerHalf):
    """Publishes its gradient; at the close, steps by the mean of the gradients the close names."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        #: This worker's published gradients by step.
        self.own: dict[int, StepResult] = {}

    def train(self, batch: Batch, epoch: float, step: int, alone: bool) -> StepResult:
        result = self.replica.gradient(batch, step)
        if alone:  # no peer to average with: step now, share nothing
            self.replica.descend(result.indices, result.values, epoch)
            empty = np.zeros(0, np.int32)
            return replace(result, indices=empty, values=empty.astype(np.float32))
        # What the peers add is the gradient as the frame carries it (`spec.sync.precision`): so does this worker,
        # or replicas drift apart. No accumulator keeps what rounding left out: it is dropped, as DDP's
        # half-precision compression drops it.
        result = replace(result, values=self.wire(result.values))
        self.own[step] = result
        return result

    def hold(self, step: int, honest: StepResult, published: StepResult) -> None:
        """The replica never applied its gradient: the one it published is what it adds at the close, as its peers
        do (moving the replica by the difference left it off the shared state)."""
        if step in self.own:
            self.own[step] = replace(published, values=self.wire(published.values))

    def combine(self, close: Close, updates: list[Update]) -> None:
        own = self.own.pop(close.step, None)
        senders = len(close.updates)
        if not senders or (own is None and not updates):
            return
        parts = [(u.sender, u.indices, u.values) for u in self.exchange.in_range(updates)]
        if own is not None and self.rank in close.updates:
            parts.append((self.rank, own.indices, own.values))
        parts.sort(key=lambda part: part[0])  # one order on every replica: their float32 sums then agree
        entries, mean = mean_update([p[1] for p in parts], [p[2] for p in parts], senders)
        # The rate of the step's union batch, the senders' cursor positions before the close's: the same for every
        # replica (each at its own batch's rate, a warm-up's or a cosine's rates took the replicas apart).
        epoch = self.feed.schedule.progress(close.cursor - senders, senders)
        self.replica.descend(entries, mean, epoch, senders)

    def withdraw_unread(self, after: int) -> None:
        """A gradient published for a step no one closes was never applied: it is dropped, not kept as pending."""
        self.exchange.unread(after)
        self.own = {step: own for step, own in self.own.items() if step <= after}


@register
class GradientAveraging(Bsp):
    """Every step, one optimizer step by the mean of the workers' gradients, behind BSP's full barrier."""

    name = "gradient-averaging"
    worker_half = GradientHalf
    sums_updates = False
    share_optimizer = True
