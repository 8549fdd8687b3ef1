"""Throttled progress on stderr, so that long commands show signs of life.

`mlless train` shows a status line as steps close (rewritten in place on a
terminal, printed every few seconds otherwise), ending in the job's progress,
ETA and projected cost, and messages between them;
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


def _fmt_duration(seconds: float) -> str:
    """0.4s, 42s, 3m05s, 2h07m: tenths under 10 s, where a short job's ETA and its band would all read 0s."""
    if seconds < 9.95:
        return f"{seconds:.1f}s"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    return f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


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
        self._outlook = ""  # the newest progress, ETA and projected cost, shown at the end of the status line

    def outlook(self, progress: float, eta_seconds: float | None, projected_cost: float | None,
                limit: str | None = None, eta_band: tuple[float, float] | None = None, at_most: bool = False) -> None:
        """The job's newest progress, ETA and projected cost (runtime/supervisor/eta.py), for the next status line,
        with the stop limit they count towards (`spec.stop`'s field): an ETA to `maxEpochs` while patience may end
        the job sooner (`at_most`) says when it ends at the latest (eta ≤12s to maxEpochs), one to `patience` when
        it is expected to, within `eta_band` (eta 40s (25s-1m10s) to patience)."""
        band = "" if eta_band is None else f" ({_fmt_duration(eta_band[0])}-{_fmt_duration(eta_band[1])})"
        eta = "-" if eta_seconds is None else (
            ("≤" if at_most else "") + _fmt_duration(eta_seconds) + band + (f" to {limit}" if limit else ""))
        self._outlook = f"  {100 * progress:3.0f}%  eta {eta}  -> ${_fmt(projected_cost, '.5f')}"

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
            f"workers {workers}  {_fmt_bytes(bytes_per_step)}/step  {elapsed:7.1f}s  ${cost:.5f}{self._outlook}"
        )
        self.stream.write(("\r\x1b[2K" + line) if self.tty else line + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        if self.enabled:
            self.stream.write(("\n" if self.tty and self._last else "") + text + "\n")
            self.stream.flush()
            self._last = 0.0 if self.tty else self._last
