"""Insignificance-bounded synchronous parallel (the MLLess paper's protocol)."""
from __future__ import annotations

from mlless.sync.base import register
from mlless.sync.protocols.bsp import Bsp


@register
class Isp(Bsp):
    """BSP's barrier, but only the entries the significance filter lets through (`spec.sync.significanceThreshold`)."""

    name = "isp"

    @property
    def threshold(self) -> float:
        return self.config.significance_threshold
