"""Throttled progress on stderr, so that long commands show signs of life.

`mlless train` shows a status line as steps close (rewritten in place on a
terminal, printed every few seconds otherwise) and messages between them;
`mlless prepare` shows how many rows it has read and written, and how fast.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO


def _fmt(value: float | None, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    raise AssertionError("unreachable")


class Progress:
    def __init__(self, label: str = "", enabled: bool = True, interval: float = 2.0, stream: TextIO | None = None):
        """`label` names the row counts (`update`) and `interval` paces them; the status line keeps its own pace."""
        self.label = label
        self.enabled = enabled
        self.interval = interval
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.monotonic()
        self._last = 0.0  # when a line was last shown

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def _due(self, gap: float) -> bool:
        """Whether a line may be shown now, `gap` seconds after the last one; if so, it counts as shown."""
        now = time.monotonic()
        if not self.enabled or now - self._last < gap:
            return False
        self._last = now
        return True

    def update(self, count: int, phase: str = "read") -> None:
        """`count` rows done: shown every `interval`, once a rate over a whole interval is known."""
        if self.elapsed() >= self.interval and self._due(self.interval):
            rate = count / max(self.elapsed(), 1e-9)
            print(f"[{self.label}] {phase}: {count:,} rows, {rate:,.0f} rows/s", file=self.stream, flush=True)

    def status(
        self,
        *,
        step: int,
        epoch: float,
        train_loss: float,
        validation_loss: float | None,
        workers: int,
        bytes_per_step: float,
        elapsed: float,
        cost: float,
    ) -> None:
        """A training job's status line, at a step close."""
        if not self._due(0.2 if self.tty else 5.0):
            return
        line = (
            f"step {step:>6}  epoch {epoch:6.2f}  loss {_fmt(train_loss)}  val {_fmt(validation_loss)}  "
            f"workers {workers}  {_fmt_bytes(bytes_per_step)}/step  {elapsed:7.1f}s  ${cost:.5f}"
        )
        self.stream.write(("\r\x1b[2K" + line) if self.tty else line + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        if self.enabled:
            self.stream.write(("\n" if self.tty and self._last else "") + text + "\n")
            self.stream.flush()
            self._last = 0.0 if self.tty else self._last
