"""Stale-synchronous parallel."""
from __future__ import annotations

from mlless.sync.base import register
from mlless.sync.protocols.bsp import Bsp


@register
class Ssp(Bsp):
    """Every non-zero entry, and a worker may run `spec.sync.slack` closed steps ahead."""

    name = "ssp"

    @property
    def staleness(self) -> int:
        return self.config.slack
