"""The scale-in auto-tuner's decision logic (MLLess and MLES §4.2).

Pure and synchronous: the supervisor calls :meth:`AutoTuner.observe` once per closed step with the
aggregated loss, a monotonic timestamp and the number of workers that trained the step, and acts on the
returned :class:`Decision`. No I/O, no wall clock, no exceptions for bad input (a "no-decision" instead).

Lifecycle:

1. Before the knee: feed the knee detector, return None. Never remove before the knee.
2. At the knee (P = current workers): fit the reference curve L_P on the EWMA-filtered P-worker losses,
   estimate d_P, and decide "remove" (or "keep" at ``min_workers``).
3. Every ``interval_seconds`` afterwards: fit ℓ_p on the losses since the last removal only, estimate d_p
   (skipping the first 4 steps after the removal), and compute

       s = (ℓ_p(t + ⌊Δ/d_p⌋) − L_P(t + ⌊Δ/d_P⌋)) / L_P(t + ⌊Δ/d_P⌋)

   Remove one more worker iff s < S. **Erratum:** the papers print the numerator the
   other way round (L_P − ℓ_p), which would remove workers exactly when the projected loss with fewer
   workers is *worse*. Here a projected loss higher than the reference by ≥ S keeps the workers; a
   negative s (fewer workers converge faster in wall-clock, e.g. less communication) removes.

"Since the last removal" starts at the step after a "remove" decision, and again at the first step whose
worker count differs from the previous step's (the removal taking effect, or an external scale change).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .curves import CurveFitError, FittedCurve, fit_reference, fit_slow
from .durations import robust_step_duration
from mlless.smoothing import ewma
from mlless.spec.config import TunerConfig

from .knee import KneeDetector, make_knee_detector

__all__ = ["AutoTuner", "Decision", "Outcome"]

log = logging.getLogger(__name__)

Outcome = Literal["remove", "keep", "no-decision"]

REFERENCE_MIN_POINTS = 8
"""The reference fit has 4 parameters and sees the whole fast-descent region: fewer than 8 points is noise."""
SLOW_MIN_POINTS = 4
"""As the original: the slow fit needs at least 4 points (the original crashed with fewer)."""
SKIP_STEPS_AFTER_REMOVAL = 4
"""As the original: the first steps after a removal include the leave/average handshake; not timed."""


@dataclass(frozen=True)
class Decision:
    """What the supervisor should do after this step. "remove" means remove exactly one worker now."""

    step: int
    outcome: Outcome
    reason: str
    projected_gap: float | None = None  # s, when it was computed


@dataclass
class _Segment:
    """The points observed since the last removal / worker-count change."""

    workers: int
    first_of_run: bool  # the job's first segment: no removal handshake to skip
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    def durations(self, skip: int) -> np.ndarray:
        """Per-step durations (gaps divided evenly), skipping the first ``skip`` steps of the segment."""
        if len(self.steps) < 2:
            return np.empty(0)
        st = np.asarray(self.steps, dtype=np.float64)
        tm = np.asarray(self.times, dtype=np.float64)
        d = np.diff(tm) / np.diff(st)
        return d[skip:]


class AutoTuner:
    """Scale-in auto-tuner; see the module docstring for the algorithm."""

    def __init__(self, config: TunerConfig) -> None:
        self._cfg = config
        self._knee: KneeDetector = make_knee_detector(config.knee)
        self._segment: _Segment | None = None
        self._new_segment_next = False
        self._last_step: int | None = None
        self._last_time: float | None = None
        self._reference: FittedCurve | None = None
        self._ref_workers: int | None = None
        self._d_ref: float | None = None
        self._slow: FittedCurve | None = None
        self._d_cur: float | None = None
        self._next_eval: float | None = None
        self._removals = 0
        self._last_decision: Decision | None = None

    # ---- public surface -------------------------------------------------------------------------------

    @property
    def knee_step(self) -> int | None:
        """The accepted knee step, or None before it."""
        return self._knee.knee_step

    @property
    def state(self) -> dict[str, object]:
        """A JSON-friendly snapshot for metrics and logs."""
        seg = self._segment
        last = self._last_decision
        return {
            "enabled": self._cfg.enabled,
            "knee_step": self.knee_step,
            "knee": self._knee.state(),
            "reference_workers": self._ref_workers,
            "reference": self._reference.as_dict() if self._reference else None,
            "d_ref": self._d_ref,
            "slow": self._slow.as_dict() if self._slow else None,
            "d_current": self._d_cur,
            "removals": self._removals,
            "next_evaluation": self._next_eval,
            "segment_first_step": seg.steps[0] if seg and seg.steps else None,
            "segment_points": len(seg.steps) if seg else 0,
            "last_decision": None if last is None else {
                "step": last.step, "outcome": last.outcome, "reason": last.reason,
                "projected_gap": last.projected_gap},
        }

    def observe(self, step: int, loss: float, now: float, workers: int) -> Decision | None:
        """Feed one closed step; return a Decision when there is something to decide, else None."""
        if not self._cfg.enabled:
            return None
        try:
            step_i, loss_f, now_f, workers_i = int(step), float(loss), float(now), int(workers)
        except (TypeError, ValueError, OverflowError) as exc:
            return self._no_decision(-1 if not isinstance(step, int) else step, f"unusable observation: {exc}")
        if self._last_step is not None and step_i <= self._last_step:
            return self._no_decision(step_i, f"step {step_i} does not advance past {self._last_step}: ignored")
        if not math.isfinite(now_f) or (self._last_time is not None and now_f < self._last_time):
            return self._no_decision(step_i, f"timestamp {now!r} is not finite and monotonic: ignored")
        if workers_i < 1:
            return self._no_decision(step_i, f"worker count {workers_i} < 1: ignored")
        if not math.isfinite(loss_f):
            return self._no_decision(step_i, f"non-finite loss {loss_f!r} at step {step_i}: ignored")
        self._record(step_i, loss_f, now_f, workers_i)

        if self.knee_step is None:
            if self._knee.update(step_i, loss_f) is None:
                return None
            log.info("auto-tuner: knee accepted at step %d (seen at step %d)", self.knee_step, step_i)
            return self._decide_at_knee(step_i, now_f, workers_i)
        if self._next_eval is None or now_f < self._next_eval:
            return None
        if self._reference is None:  # the fit at the knee failed: retry
            return self._decide_at_knee(step_i, now_f, workers_i)
        return self._decide_interval(step_i, now_f, workers_i)

    # ---- internals ------------------------------------------------------------------------------------

    def _record(self, step: int, loss: float, now: float, workers: int) -> None:
        seg = self._segment
        if seg is None or self._new_segment_next or workers != seg.workers:
            self._segment = seg = _Segment(workers=workers, first_of_run=seg is None)
            self._new_segment_next = False
        seg.steps.append(step)
        seg.losses.append(loss)
        seg.times.append(now)
        self._last_step, self._last_time = step, now

    def _emit(self, decision: Decision) -> Decision:
        self._last_decision = decision
        level = logging.WARNING if decision.outcome == "no-decision" else logging.INFO
        log.log(level, "auto-tuner step %d: %s (%s)", decision.step, decision.outcome, decision.reason)
        if decision.outcome == "remove":
            self._removals += 1
            self._new_segment_next = True
        return decision

    def _no_decision(self, step: int, reason: str) -> Decision:
        return self._emit(Decision(step, "no-decision", reason))

    def _estimate_duration(self, seg: _Segment) -> float | None:
        skip = 0 if seg.first_of_run else SKIP_STEPS_AFTER_REMOVAL
        return robust_step_duration(seg.durations(skip))

    def _decide_at_knee(self, step: int, now: float, workers: int) -> Decision:
        self._next_eval = now + self._cfg.interval_seconds
        seg = self._segment
        assert seg is not None
        where = f"knee at step {self.knee_step}"
        if len(seg.steps) < REFERENCE_MIN_POINTS:
            return self._no_decision(step, f"{where}: too few {workers}-worker points for the reference fit "
                                           f"({len(seg.steps)} < {REFERENCE_MIN_POINTS}); retrying next interval")
        try:
            reference = fit_reference(seg.steps, ewma(seg.losses, self._cfg.knee.span),
                                      min_points=REFERENCE_MIN_POINTS)
        except CurveFitError as exc:
            return self._no_decision(step, f"{where}: reference fit failed ({exc}); retrying next interval")
        d_ref = self._estimate_duration(seg)
        if d_ref is None:
            return self._no_decision(step, f"{where}: no usable step durations for d_P; retrying next interval")
        self._reference, self._ref_workers, self._d_ref = reference, workers, d_ref
        fit = f"reference fit L_P on {reference.n_points} points, d_P={d_ref * 1e3:.1f} ms"
        if workers <= self._cfg.min_workers:
            return self._emit(Decision(step, "keep", f"{where}: {fit}; already at min_workers={self._cfg.min_workers}"))
        return self._emit(Decision(step, "remove", f"{where}: {fit}; removing 1 of {workers}"))

    def _decide_interval(self, step: int, now: float, workers: int) -> Decision:
        self._next_eval = now + self._cfg.interval_seconds
        if workers <= self._cfg.min_workers:
            return self._emit(Decision(step, "keep", f"at min_workers={self._cfg.min_workers}"))
        seg = self._segment
        assert seg is not None and self._reference is not None and self._d_ref is not None
        if len(seg.steps) < SLOW_MIN_POINTS:
            return self._no_decision(step, f"too few points since the last removal "
                                           f"({len(seg.steps)} < {SLOW_MIN_POINTS})")
        try:
            slow = fit_slow(seg.steps, ewma(seg.losses, self._cfg.knee.span), min_points=SLOW_MIN_POINTS)
        except CurveFitError as exc:
            return self._no_decision(step, f"slow-convergence fit ℓ_p failed ({exc})")
        d_cur = self._estimate_duration(seg)
        if d_cur is None:
            return self._no_decision(step, f"no usable step durations since the last removal "
                                           f"(first {SKIP_STEPS_AFTER_REMOVAL} are skipped)")
        self._slow, self._d_cur = slow, d_cur
        horizon = self._cfg.horizon_seconds
        k_ref, k_cur = math.floor(horizon / self._d_ref), math.floor(horizon / d_cur)
        ref_loss, cur_loss = float(self._reference(step + k_ref)), float(slow(step + k_cur))
        if not (math.isfinite(ref_loss) and math.isfinite(cur_loss) and ref_loss > 0):
            return self._no_decision(step, f"projection not usable (L_P={ref_loss!r}, ℓ_p={cur_loss!r})")
        gap = (cur_loss - ref_loss) / ref_loss  # the erratum's sign: positive = fewer workers do worse
        detail = (f"ℓ_{workers}(t+{k_cur})={cur_loss:.5g} vs L_{self._ref_workers}(t+{k_ref})={ref_loss:.5g}, "
                  f"s={gap:+.4f}, S={self._cfg.threshold:g}")
        if gap < self._cfg.threshold:
            return self._emit(Decision(step, "remove", f"{detail}: within threshold, removing 1 of {workers}", gap))
        return self._emit(Decision(step, "keep", f"{detail}: projected loss too far above the reference", gap))
