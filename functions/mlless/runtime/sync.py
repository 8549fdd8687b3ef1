"""Synchronisation protocols: what BSP, ISP and SSP change in the worker loop and the supervisor.

All three run the same loop: a worker trains a step, publishes the significant
part of its update, reports, and applies the peers' updates named by the
supervisor's step-close. They differ in two answers, which `SyncStrategy`
gives and the loops read instead of comparing protocol names:

* `threshold`: the significance filter's v (ISP); 0 publishes every non-zero
  entry (BSP, SSP);
* `staleness`: how many closed steps a worker may run ahead of; 0 is a full
  barrier (BSP, ISP).

A new protocol is a new subclass registered in `STRATEGIES` under the name
`spec.sync.protocol` gives it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from mlless.protocol import keys
from mlless.spec.job import SyncConfig


@dataclass(frozen=True)
class SyncStrategy(ABC):
    config: SyncConfig

    @property
    @abstractmethod
    def threshold(self) -> float:
        """The significance filter's v for the replicas."""

    @property
    @abstractmethod
    def staleness(self) -> int:
        """How many closed steps a worker may run ahead of."""

    def must_have_closed(self, step: int) -> int:
        """The step whose close a worker that has trained `step` steps awaits before it trains the next one.

        Step 0's close carries the worker set, so no one may start before it.
        """
        return max(step - self.staleness, 0)

    def update_key(self, rank: int, step: int) -> str:
        """Where `rank` publishes its update of `step`: slots are reused once no worker can still read them."""
        return keys.update(rank, step, self.staleness)


class Bsp(SyncStrategy):
    """Bulk-synchronous: every non-zero entry every step, behind a full barrier."""

    @property
    def threshold(self) -> float:
        return 0.0

    @property
    def staleness(self) -> int:
        return 0


class Isp(Bsp):
    """Insignificance-bounded: BSP's barrier, but only entries the significance filter lets through."""

    @property
    def threshold(self) -> float:
        return self.config.significance_threshold


class Ssp(Bsp):
    """Stale-synchronous: every non-zero entry, and a worker may run `slack` closed steps ahead."""

    @property
    def staleness(self) -> int:
        return self.config.slack


STRATEGIES: dict[str, type[SyncStrategy]] = {"bsp": Bsp, "isp": Isp, "ssp": Ssp}


def sync_strategy(config: SyncConfig) -> SyncStrategy:
    """The strategy `config.protocol` names (the manifest schema admits only registered names)."""
    return STRATEGIES[config.protocol](config)
