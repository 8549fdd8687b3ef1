"""norm-isp: ISP with SPIRT's norm-based significance filter (SPIRT §VI.C.4), for networks.

Each step runs behind BSP's barrier. A worker trains on its own replica and accumulates what it applied since its
last send; once the sum over those steps of the accumulated update's norm relative to the model's passes
`spec.sync.normThreshold`, it publishes the accumulated update whole (training/norm_filter.py has the rule; with
`spec.sync.normScope: layer` each parameter tensor is measured and sent on its own). Steps where no worker sends
cost the barrier and no update bytes.

Every replica adds a sent update divided by P, the workers in the job at that step (those the close names live,
and the senders that leave at it): the shared state moves by the workers' mean progress, as under model
averaging (averaging.py), and the sender keeps 1/P of its own update (`Replica.correct`, which counts the
correction as its contribution for the MLLESS_AUDIT check). Unlike averaging's mean over the frames that carry an
entry, the divisor does not depend on who sent at that step: with this filter the workers send at different
steps, and a lone sender's update divided by 1 would be ISP's sum again.

The rest is ISP's: a replica is the shared state plus its own pending update; a leaver's pending update is merged
in full (`Worker._merge_leavers`), a joiner starts from a donor's replica minus its pending update, and each worker
keeps its own optimizer (a joiner's starts fresh).

Measured on the digits (examples/digits-cnn.yaml: the cnn's 151,306 parameters in 8 tensors, Adam at 0.001, 30
epochs, 375 steps at P = 2; validation loss and accuracy of the model kept, on 200 images; seeds 0-2 or 0-1; a
loaded 2-core machine):

    protocol                       bytes/step    val. loss            accuracy
    gradient-averaging             1,210,532     0.080 0.060 0.079    0.975 0.970 0.970
    norm-isp 0.03                  217-219 k     0.072 0.061          0.975 0.975
    norm-isp 0.1 (the default)     117-120 k     0.070 0.064 0.069    0.980 0.985 0.975
    norm-isp 0.3                   64-65 k       0.066 0.068          0.975 0.975
    norm-isp 1                     34-35 k       0.066 0.059 0.068    0.975 0.970 0.975
    norm-isp 3                     18-20 k       0.065 0.052          0.975 0.975
    norm-isp 10                    9.2-9.3 k     0.066 0.054          0.975 0.980
    norm-isp 0.1, layer            118-120 k     0.066 0.063          0.980 0.980
    norm-isp 0.3, layer            68 k          0.065 0.062          0.975 0.980
    norm-isp 1, layer              35-36 k       0.068 0.063          0.975 0.975
    isp (per entry, v = 0.7)       83-88 k       0.070 0.057          0.975 0.975
    summed 0.1                     111-114 k     0.039 0.054 0.047    0.990 0.970 0.985
    summed 1                       30-56 k       0.071, diverged twice

On the digits the quality held from 0.03 to 10 while the bytes fell 130-fold; the default 0.1 has a worker send
every 10 steps or so, within averaging's `localSteps` (16) that a harder task is known to bear, at a tenth of
gradient averaging's bytes. Per layer sent as many bytes as the whole model, for the same quality: the whole
model's rule is SPIRT's, and the default. The per-entry filter's pass over every weight cost 10 ms a step against
1.7 ms for the norms (the cnn's step computes in 50 ms).

Summed ("summed": each update added in full, ISP's combine, through a plugin strategy) trained better at 0.1 and
P = 2 (and at P = 4: validation loss 0.076 and 0.042 against the mean's 0.086 and 0.075), but at threshold 1 it
diverged in two runs of three at P = 2 and at P = 4 (the supervisor stopped them as diverged: their smoothed
validation loss rose to several times its best, up to 1.2): an update accumulated over tens of steps, added
P-fold, overshoots. The mean trained at every threshold and
P tried, so the threshold decides only how much is sent, not whether the job trains.
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
