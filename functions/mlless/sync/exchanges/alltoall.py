"""All-to-all: every worker writes its update to its own ring of slots and reads every peer's (the papers' pattern)."""
from __future__ import annotations

import numpy as np

from mlless.protocol.messages import Close, Update
from mlless.sync.exchanges.base import Exchange, register


@register
class AllToAll(Exchange):
    """Each worker writes its update to its own slot, and reads every peer's: P − 1 frames per worker per step."""

    name = "all-to-all"

    def publish(self, step: int, indices: np.ndarray, values: np.ndarray) -> int:
        return self.write(step, self.key_of(self.rank, step), indices, values)

    def gather(self, close: Close) -> list[Update]:
        step, senders = close.step, [r for r in close.updates if r != self.rank]
        frames = self.fetch([self.key_of(r, step) for r in senders])
        updates = [u for r, frame in zip(senders, frames) if (u := self.checked(r, step, frame)) is not None]
        if self.aggregation is None:
            return updates
        return self.combined(step, updates, [p for p in self.outbox if p.step == step and self.rank in close.updates])
