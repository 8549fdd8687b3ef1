"""Asynchronous model averaging: averaging's rounds (`averaging.py`) without the barrier at a round's end.

A worker publishes what it changed in a round and starts the next round at once; it does not wait for the round
to close. At its later round ends it reads the closes that have come meanwhile and applies each closed round's
frames, averaged as under `averaging`: every worker reads the same frames for a round, so the shared state stays
one. Its own frame for that round is counted among the round's carriers; a replica is still the shared state
plus its own unsent updates. Rounds published but not closed yet are treated like SSP's frames for later steps.

The asynchrony is bounded, as in Cirrus' and LambdaML's asynchronous runs, where a worker's pull is never more
than a round stale. A worker trains round k + 1 while round k closes, and waits only if round k − 1 has not
closed when round k + 1 begins: a worker never gets more than one round ahead of the newest close. A slower
peer therefore costs a round of overlap instead of a barrier every round. The supervisor still closes every
step, so accounting, evaluation, stop rules and the auto-tuner see the job step by step. The staleness of what a
worker trains on is at most two rounds of its peers' changes: 2 `spec.sync.localSteps` − 1 steps.
"""
from __future__ import annotations

from mlless.protocol import keys
from mlless.sync.base import register
from mlless.sync.protocols.averaging import Averaging


@register
class Asynchronous(Averaging):
    """Averaging's rounds, with the next round trained while the previous one closes."""

    name = "async"

    @property
    def staleness(self) -> int:
        return 2 * self.config.local_steps - 1

    def must_have_closed(self, step: int) -> int:
        """The close of the round before the previous one: a worker runs at most one round ahead."""
        return max(super().must_have_closed(step) - self.config.local_steps, 0)

    def update_key(self, rank: int, step: int) -> str:
        # A round's frame is read at its close, by then a round later at most: two rounds' frames are readable.
        return keys.update(rank, step // self.config.local_steps, 1)

    @property
    def slots(self) -> int:
        return keys.update_slots(1)
