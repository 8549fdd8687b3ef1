"""Where a worker's step spends its time, phase by phase (`mlless.contract.STEP_PHASES`)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from mlless.contract import STEP_PHASES


@dataclass
class PhaseTimer:
    """Seconds per phase; each lap charges the time since the previous mark to one phase."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STEP_PHASES, 0.0))
    _mark: float = field(default_factory=time.perf_counter)

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] += now - self._mark
        self._mark = now

    def record(self, **phases: float) -> None:
        """Phases timed by the callee; the time since the last mark is theirs."""
        for phase, seconds in phases.items():
            self.seconds[phase] += seconds
        self._mark = time.perf_counter()
