"""Throttled progress lines on stderr (rows/s), so long preparations show signs of life."""
from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, label: str, enabled: bool = True, interval: float = 2.0, stream: TextIO | None = None):
        self.label = label
        self.enabled = enabled
        self.interval = interval
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self._last = self.start
        self.count = 0

    def update(self, count: int, phase: str = "read") -> None:
        self.count = count
        now = time.perf_counter()
        if self.enabled and now - self._last >= self.interval:
            self._last = now
            rate = count / max(now - self.start, 1e-9)
            print(f"[{self.label}] {phase}: {count:,} rows, {rate:,.0f} rows/s", file=self.stream, flush=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start
