"""Who leaves on scale-in.

The papers remove the "lowest-quality replica" without defining it; the
original code evicted whichever worker reported last. Here quality is each
worker's recent training loss: an exponentially weighted mean of its
per-step loss (loss sum / samples of its own mini-batches). Every worker
trains the same shared model plus its own unsent updates, on batches drawn
from the same shuffled stream, so over several steps a persistently higher
loss points at the replica whose local drift hurts most.
"""
from __future__ import annotations

import math


class ReplicaQuality:
    """EWMA of each worker's per-step training loss; the worst is evicted first."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.loss: dict[int, float] = {}

    def observe(self, rank: int, loss_sum: float, samples: int) -> None:
        if samples <= 0 or not math.isfinite(loss_sum):
            return
        loss = loss_sum / samples
        previous = self.loss.get(rank)
        self.loss[rank] = loss if previous is None else previous + self.alpha * (loss - previous)

    def worst(self, ranks: tuple[int, ...]) -> int:
        """The rank with the highest recent loss; ties (or no data) go to the highest rank."""
        return max(ranks, key=lambda r: (self.loss.get(r, -math.inf), r))
