"""Bulk-synchronous parallel: every non-zero entry every step, behind a full barrier."""
from __future__ import annotations

from mlless.sync.base import SyncStrategy, register


@register
class Bsp(SyncStrategy):
    """Every non-zero entry every step, behind a full barrier."""

    name = "bsp"

    @property
    def threshold(self) -> float:
        return 0.0

    @property
    def staleness(self) -> int:
        return 0
