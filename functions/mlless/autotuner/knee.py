"""Online knee detection on the training-loss curve (MLLess and MLES §4.2).

The tuner never removes a worker before the knee: until the loss flattens, more workers buy fast progress.

``method="slope"`` — the papers' heuristic, made scale-free so that one threshold fits every loss scale:
    g_t = EWMA_span( Δ EWMA_span(loss) )_t / scale,   scale = the first smoothed loss,
and the knee is the first step at which g rises above −``slope`` *after having been below it* (a curve
that never descended — flat, or rising — has no knee). Because g is relative to the loss scale, RMSE-scale
and BCE-scale losses (or the same curve ×0.1, ×10) give the same knee. The original used an absolute
−7.5e−5 on MSE; see :class:`KneeConfig` for the default and how it was chosen.

Stability: the EWMA here is causal, so a crossing, once seen, is never revised by later data (the original's
forward+backward EWMA was, hence its "unchanged for 5 checks" rule). What noise *can* do is push g above the
threshold for a step or two in the middle of the fast-descent region. So the causal equivalent of "the
candidate stays unchanged for ``stable_checks`` checks" is: g must stay above −slope for ``stable_checks``
consecutive checks (observed steps); if it dips back below, the candidate is dropped. The knee reported is
the first step of that run. No candidate is considered during the first ``span`` steps (EWMA warm-up),
which keeps start-up noise (e.g. a flat first few steps) from being taken for a knee.

``method="kneedle"`` — Satopää et al. 2011 ("Kneedle"), the pluggable alternative the paper mentions,
implemented here on the causally-smoothed curve: normalise the window to the unit square, take the
difference curve (chord minus curve for a decreasing convex curve) and its maximum as the candidate, when
it is prominent enough (a straight line has none). Online, the window grows, so the candidate drifts a
little; it is accepted once it stays within a small tolerance for ``stable_checks`` checks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
from numpy.typing import ArrayLike

from mlless.smoothing import OnlineEwma
from mlless.spec.config import KneeConfig

__all__ = ["KneeDetector", "SlopeKneeDetector", "KneedleKneeDetector", "kneedle",
           "make_knee_detector"]


class KneeDetector(ABC):
    """Fed one (step, finite loss) per closed step; returns the accepted knee step once, then keeps it.

    A subclass's `_observe` maintains a candidate step and how many checks in a
    row have confirmed it; the candidate becomes the knee after
    `stable_checks` of them, and from then on the curve is no longer read.
    """

    def __init__(self, config: KneeConfig) -> None:
        self._cfg = config
        self._candidate: int | None = None
        self._streak = 0
        self._knee: int | None = None

    @property
    def knee_step(self) -> int | None:
        return self._knee

    def update(self, step: int, loss: float) -> int | None:
        if self._knee is None:
            self._observe(step, loss)
            if self._candidate is not None and self._streak >= self._cfg.stable_checks:
                self._knee = self._candidate
        return self._knee

    @abstractmethod
    def _observe(self, step: int, loss: float) -> None:
        """Take in one point of the curve, updating the candidate and its streak."""

    @abstractmethod
    def state(self) -> dict[str, object]: ...


class SlopeKneeDetector(KneeDetector):
    """The papers' first-derivative threshold, relative to the loss scale, causal and O(1) per step."""

    def __init__(self, config: KneeConfig) -> None:
        super().__init__(config)
        self._loss = OnlineEwma(config.span)
        self._slope = OnlineEwma(config.span)
        self._prev: tuple[int, float] | None = None
        self._scale: float | None = None
        self._n = 0
        self._armed = False
        self.rel_slope: float | None = None

    def _observe(self, step: int, loss: float) -> None:
        smoothed = self._loss.update(loss)
        self._n += 1
        if self._scale is None:
            self._scale = abs(smoothed) if abs(smoothed) > 1e-12 else 1.0
        prev, self._prev = self._prev, (step, smoothed)
        if prev is None:
            return
        g = self._slope.update((smoothed - prev[1]) / max(step - prev[0], 1)) / self._scale
        self.rel_slope = g
        if g <= -self._cfg.slope:
            self._armed = True  # still descending fast: any earlier candidate was noise
            self._candidate, self._streak = None, 0
            return
        if not self._armed or self._n <= self._cfg.span:
            return
        if self._candidate is None:
            self._candidate, self._streak = step, 0
        self._streak += 1

    def state(self) -> dict[str, object]:
        return {"method": "slope", "knee_step": self._knee, "candidate": self._candidate,
                "streak": self._streak, "rel_slope": self.rel_slope, "loss_scale": self._scale,
                "armed": self._armed}


def kneedle(x: ArrayLike, y: ArrayLike, *, min_prominence: float = 0.1) -> int | None:
    """Index of the knee of a decreasing convex curve by Kneedle's difference curve, or None.

    After normalising both axes to [0, 1], the difference curve (1 − x_n) − y_n is the vertical distance
    below the chord joining the first and last points; its maximum is the point of maximum curvature
    "relative to the straight line". A straight or concave curve stays within noise of the chord, so a
    maximum below ``min_prominence`` (in unit-square units) is no knee. A maximum at the very end of the
    window is not a knee yet either (Kneedle requires the difference curve to fall after its maximum).
    """
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    if xa.size < 3 or not (np.all(np.isfinite(xa)) and np.all(np.isfinite(ya))):
        return None
    xr, yr = xa[-1] - xa[0], float(ya.max() - ya.min())
    if xr <= 0 or yr <= 1e-12 * max(abs(float(ya.max())), 1.0):
        return None
    xn = (xa - xa[0]) / xr
    yn = (ya - ya.min()) / yr
    diff = (1.0 - xn) - yn
    i = int(np.argmax(diff))
    if diff[i] < min_prominence or i >= xa.size - 2 or i == 0:
        return None
    return i


class KneedleKneeDetector(KneeDetector):
    """Kneedle on the causally-smoothed loss over the growing window, accepted once stable."""

    def __init__(self, config: KneeConfig, *, tolerance: float = 0.02, min_prominence: float = 0.1) -> None:
        super().__init__(config)
        self._ewma = OnlineEwma(config.span)
        self._steps: list[int] = []
        self._smoothed: list[float] = []
        self._tol = tolerance
        self._prominence = min_prominence
        self._anchor: int | None = None

    def _observe(self, step: int, loss: float) -> None:
        self._steps.append(step)
        self._smoothed.append(self._ewma.update(loss))
        if len(self._steps) <= 2 * self._cfg.span:
            return
        i = kneedle(self._steps, self._smoothed, min_prominence=self._prominence)
        if i is None:
            self._anchor, self._candidate, self._streak = None, None, 0
            return
        cand = self._steps[i]
        if self._anchor is not None and abs(cand - self._anchor) <= max(1.0, self._tol * self._anchor):
            self._streak += 1
        else:
            self._anchor, self._streak = cand, 1
        self._candidate = cand

    def state(self) -> dict[str, object]:
        return {"method": "kneedle", "knee_step": self._knee, "candidate": self._candidate,
                "streak": self._streak}


def make_knee_detector(config: KneeConfig) -> KneeDetector:
    """The detector named by ``config.method``."""
    if config.method == "kneedle":
        return KneedleKneeDetector(config)
    return SlopeKneeDetector(config)
