"""norm-isp: ISP with SPIRT's norm-based significance filter (SPIRT §VI.C.4), for networks.

Each step runs behind BSP's barrier. A worker trains on its own replica and accumulates what it applied since its
last send; once the sum over those steps of the accumulated update's norm relative to the model's passes
`spec.sync.normThreshold`, it publishes the accumulated update whole (training/norm_filter.py has the rule; with
`spec.sync.normScope: layer` each parameter tensor is measured and sent on its own). Steps where no worker sends
cost the barrier and no update bytes.

Every replica adds a sent update divided by P, the workers in the job at that step (those the close names live,
and the senders that leave at it): the shared state moves by the workers' mean progress, as under model
averaging (averaging.py), and the sender keeps 1/P of its own update (`Replica.correct`, which counts the
correction as its contribution for the MLLESS_AUDIT check). Adding each update in full, as ISP does, moves the
network P-fold, by P workers' Adam steps each scaled to the learning rate: on the digits (examples/digits-cnn.yaml)
at P = 2 that TBD. Unlike averaging's mean over the frames that carry an entry, the divisor does not depend on who
sent at that step: with this filter the workers send at different steps, and a lone sender's update divided by 1
would be ISP's sum again.

The rest is ISP's: a replica is the shared state plus its own pending update; a leaver's pending update is merged
in full (`Worker._merge_leavers`), a joiner starts from a donor's replica minus its pending update, and each worker
keeps its own optimizer (a joiner's starts fresh).

Figures on the digits at P = 2 (TBD).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from mlless.protocol.messages import Close, Update
from mlless.sync.base import SyncStrategy, WorkerHalf, register
from mlless.training.models import Model
from mlless.training.norm_filter import NormFilter

#: The groups each `spec.sync.normScope` measures, as bounds into the parameters (`NormFilter`).
SCOPES: dict[str, Callable[[Model], np.ndarray]] = {
    "model": lambda model: np.array([0, model.size], np.int64),
    "layer": lambda model: model.segments(),
}


def sharers(close: Close) -> int:
    """The workers a sent update of `close.step` is shared among: those in the job after the close, and the
    senders that leave at it."""
    return max(len(set(close.live) | set(close.updates)), 1)


class NormHalf(WorkerHalf):
    """At a close, every replica adds each sent update divided by the workers; a sender keeps that share of its own."""

    def combine(self, close: Close, updates: list[Update]) -> None:
        share = np.float32(1 / sharers(close))
        super().combine(close, [Update(u.sender, u.step, u.indices, u.values * share) for u in updates])
        if self.rank in close.updates:
            for published in (p for p in self.exchange.outbox if p.step == close.step):
                self.replica.correct(published.indices, (share - np.float32(1)) * published.values)


@register
class NormIsp(SyncStrategy):
    """BSP's barrier; a worker sends its accumulated update whole once the sum of its relative norms passes
    `spec.sync.normThreshold`, and every replica adds it divided by the workers."""

    name = "norm-isp"
    worker_half = NormHalf
    sums_updates = False

    @property
    def threshold(self) -> float:
        return self.config.norm_threshold

    @property
    def staleness(self) -> int:
        return 0

    def accumulator(self, model: Model) -> NormFilter:
        return NormFilter(model.params, self.config.norm_threshold, SCOPES[self.config.norm_scope](model))
