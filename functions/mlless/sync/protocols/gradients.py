"""Gradient averaging (LambdaML's GA-SGD): every step the workers exchange their mini-batch gradients, and every
replica takes one optimizer step by their mean.

A worker computes its batch's mean gradient at the shared parameters and publishes it without applying it
(`Replica.gradient`). At the step's close it reads its peers' gradients as the exchange pattern says (all-to-all,
allreduce, scatter-reduce or in-store), adds its own, divides by the n senders the close names, and steps its
optimizer by that mean (`Replica.descend`). Every replica starts equal, applies the same mean with the same
optimizer state, and so stays equal: the job trains as one network on a global batch P times a worker's, which is
what PyTorch's DistributedDataParallel computes. Under bsp a worker's Adam step is added in full to every replica,
so P workers move the network P-fold and with P different Adam states; on the digits (examples/digits-cnn.yaml)
that cost about a point of validation accuracy at P = 2.

A robust rule (`spec.sync.aggregation`) replaces the sum of the n gradients by n times its centre (median,
trimmed mean, Multi-Krum), as it does for updates: the mean is then the rule's centre.

Nothing is ever pending: a replica is the shared state. A leaver hands on nothing, and what it published for a step
no one closed is dropped (its gradient was never applied). A joiner starts from a donor's parameters and its
optimizer's state (`SyncStrategy.share_optimizer`); a worker's checkpoint carries its optimizer's state as under
every protocol. The per-sample rules (adagrad, normalized) and a model's own rule update inside the batch and
publish no gradient: the schema refuses them with this protocol (`mlless.spec.pairings.MINI_BATCH_PROTOCOLS`).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from mlless.data.batches import Batch
from mlless.protocol.messages import Close, Update
from mlless.sync.base import SyncStrategy, WorkerHalf, register
from mlless.sync.sums import sparse_sum
from mlless.training.replica import StepResult


class GradientHalf(WorkerHalf):
    """Publishes its gradient; at the close, steps by the mean of the gradients the close names."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        #: This worker's published gradients by step.
        self.own: dict[int, StepResult] = {}
        #: The epoch of the newest step trained, whose learning rate applies that step's mean.
        self.epoch = 1.0

    def train(self, batch: Batch, epoch: float, step: int, alone: bool) -> StepResult:
        result = self.replica.gradient(batch, step)
        self.epoch = epoch
        if alone:  # no peer to average with: step now, share nothing
            self.replica.descend(result.indices, result.values, epoch)
            empty = np.zeros(0, np.int32)
            return replace(result, indices=empty, values=empty.astype(np.float32))
        self.own[step] = result
        return result

    def combine(self, close: Close, updates: list[Update]) -> None:
        own = self.own.pop(close.step, None)
        senders = len(close.updates)
        if not senders or (own is None and not updates):
            return
        parts = [(u.indices, u.values) for u in self.exchange.in_range(updates)]
        if own is not None and self.rank in close.updates:
            parts.append((own.indices, own.values))
        entries, sums, _ = sparse_sum([p[0] for p in parts], [p[1] for p in parts])
        self.replica.descend(entries.astype(np.int32, copy=False), (sums / senders).astype(np.float32), self.epoch, senders)

    def withdraw_unread(self, after: int) -> None:
        """A gradient published for a step no one closes was never applied: it is dropped, not kept as pending."""
        self.exchange.unread(after)
        self.own = {step: own for step, own in self.own.items() if step <= after}


@register
class GradientAveraging(SyncStrategy):
    """Every step, one optimizer step by the mean of the workers' gradients, behind a full barrier."""

    name = "gradient-averaging"
    worker_half = GradientHalf
    sums_updates = False
    share_optimizer = True

    @property
    def threshold(self) -> float:
        return 0.0

    @property
    def staleness(self) -> int:
        return 0
