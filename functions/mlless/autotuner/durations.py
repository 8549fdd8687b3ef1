"""Step-duration estimates d_P and d_p (MLLess and MLES §4.2).

The decision compares the two curves ⌊Δ/d⌋ steps ahead, so d must be the *typical* duration of a step at a
given worker count. Individual step durations have heavy tails (a slow Redis round trip, a GC pause, the
replica averaging right after a removal), so we drop outliers against a rolling median and take the
median of what is left. The first few steps after a removal are skipped by the caller, as the original did.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["robust_step_duration"]


def _rolling_median(x: np.ndarray, window: int) -> np.ndarray:
    """Centred rolling median, shrinking the window at the edges (no padding artefacts)."""
    half = window // 2
    n = len(x)
    return np.array([np.median(x[max(0, i - half): min(n, i + half + 1)]) for i in range(n)])


def robust_step_duration(durations: ArrayLike, *, window: int = 9, k: float = 3.0) -> float | None:
    """Median step duration after dropping outliers, or None if there is nothing usable.

    A duration is an outlier when it deviates from the rolling median by more than ``k`` robust standard
    deviations (1.4826·MAD of the deviations), with a floor of 25 % of the rolling median so that perfectly
    regular timings do not turn every tiny jitter into an outlier.
    """
    d = np.asarray(durations, dtype=np.float64)
    d = d[np.isfinite(d) & (d > 0)]
    if d.size == 0:
        return None
    if d.size < 3:
        return float(np.median(d))
    med = _rolling_median(d, window)
    dev = d - med
    mad = 1.4826 * float(np.median(np.abs(dev - np.median(dev))))
    tol = np.maximum(k * mad, 0.25 * med)
    kept = d[np.abs(dev) <= tol]
    return float(np.median(kept if kept.size else d))
