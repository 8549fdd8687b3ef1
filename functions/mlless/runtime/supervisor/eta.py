"""How far along a job is, when it will end and what it will have cost: its progress, ETA and projected cost.

Each stop limit the job has gives a fraction done and a time left: `maxSteps` and `maxEpochs` at the job's pace
(steps, and mini-batches, per second over the newer half of its training so far: the first epoch, which reads
batches the later ones find cached, is slower; the fits of the validation curve taken out of it, and those still to
come added to the time left, `Estimator._with_fits`), `maxSeconds` by the clock, `budgetUSD`
at the pace the bill grows, and the target loss or patience where `forecast.project_stop` projects them to fire on
the validation curve. The nearest limit, the one with the least time left, is the one that will end the job:
`progress` is its fraction, `etaSeconds` its time left, and `projectedCostUSD` the cost so far plus the bill's
pace over that time. A projected limit's time left has a band, `etaLowSeconds` to `etaHighSeconds`: that of its
futures' early and late stops (`forecast.BAND`), the late ones ended by the nearest other limit. The curve is
fitted again only when an evaluation came since, and the fits keep to `REFIT_SHARE` of the supervisor's time
with a burst of `REFIT_BURST`: a bucket of that many seconds, refilled at the share. The burst is for short jobs,
whose evaluations come faster than the share alone refits, so that their status does not keep showing a projection
made before the curve turned (benchmarks/forecast.py measures a fit's cost).
"""
from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from mlless.stopping.forecast import SPACING_GAPS, StopProjection, evaluation_spacing, project_stop
from mlless.stopping.rules import Standing
from mlless.spec.job import StopConfig

#: The pace is measured from standings kept this often, at most `KEPT` of them (thinned to half when full), over the
#: newest `PACE_SHARE` of the training so far (a quarter, tried on the PMF sets of benchmarks/forecast.py, put 4 of 18
#: short jobs within 20 % at half-way, a half 6 in the run before it; one run each).
SAMPLE_SECONDS = 0.05
KEPT = 2000
PACE_SHARE = 0.5
#: The most of the supervisor's time the fits of the validation curve may take, and the seconds of fits they may
#: take before the share holds them back.
REFIT_SHARE, REFIT_BURST = 0.05, 0.02


@dataclass(frozen=True)
class Outlook:
    """Where a job stands against the stop limit nearest to ending it."""

    progress: float  # the fraction of that limit done, 0 to 1
    eta_seconds: float | None  # None while the pace is not known yet
    projected_cost_usd: float | None
    limit: str | None  # the limit, by its spec.stop field (targetLoss and patience: projected); None: none known
    eta_band: tuple[float, float] | None = None  # a projected limit's ETA in its futures' band (forecast.BAND)
    at_most: bool = False  # a limit's ETA while a target loss or patience may end the job sooner


@dataclass(frozen=True)
class _Pace:
    """Steps and mini-batches per second of training (the fits of the validation curve taken out), and dollars per
    second."""

    steps: float
    batches: float
    dollars: float


class Estimator:
    def __init__(self, stop: StopConfig, evaluate_every: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.stop = stop
        self.evaluate_every = evaluate_every
        self.clock = clock
        # standings, costs and the seconds fitted so far, since the first step closed, oldest first
        self._kept: list[tuple[Standing, float, float]] = []
        self._projection: StopProjection | None = None
        self._fitted_on = 0  # evaluations the projection was fitted on
        self._fitting, self._fit_seconds = 0.0, 0.0  # seconds of every fit so far, and of the newest
        self._spacing = float(evaluate_every)  # steps between evaluations
        self._credit, self._credit_at = REFIT_BURST, math.nan  # seconds the fits may take, as of when
        self.last = Outlook(0.0, None, None, None)

    def estimate(self, at: Standing, cost_usd: float, evaluations: Sequence[tuple[int, float]]) -> Outlook:
        """The outlook at a step close: `at` and `cost_usd` now, `evaluations` the (step, validation loss) so far."""
        if not self._kept or at.elapsed - self._kept[-1][0].elapsed >= SAMPLE_SECONDS:
            self._kept = self._kept[::2] if len(self._kept) >= KEPT else self._kept
            self._kept.append((at, cost_usd, self._fitting))
        if len(evaluations) > 1:
            self._spacing = evaluation_spacing([s for s, _ in evaluations[-SPACING_GAPS - 1:]], self.evaluate_every)
        pace = self._pace(at, cost_usd)
        candidates = self._limits(at, cost_usd, pace)
        band = rule = None  # a projected rule's, and its ETA's band
        if pace is not None and pace.steps > 0:
            nearest = min((eta for _, _, eta in candidates), default=math.inf)
            until = None if nearest == math.inf else at.steps + nearest * pace.steps
            projection = self._project(evaluations, until)
            if projection is not None:
                rule = projection.rule
                candidates.append((rule, at.steps / max(projection.step, at.steps + 1),
                                   self._seconds_to(projection.step, at, pace)))
                if projection.band is not None:  # its late futures are ended by the nearest other limit, if any
                    early, late = projection.band
                    band = (self._seconds_to(early, at, pace),
                            min(nearest, self._seconds_to(late, at, pace) if late < math.inf else math.inf))
        if not candidates:
            self.last = Outlook(0.0, None, None, None)
            return self.last
        limit, fraction, eta = min(candidates, key=lambda c: c[2])
        projected = None if pace is None else cost_usd + pace.dollars * eta
        held = limit == rule and band is not None and band[1] < math.inf
        sooner = limit != rule and (bool(self.stop.patience) or self.stop.target_loss is not None)
        self.last = Outlook(min(max(fraction, 0.0), 1.0), eta, projected, limit, band if held else None, sooner)
        return self.last

    @property
    def projected_from(self) -> int:
        """How many evaluations the stop rule's projection was last fitted on (0: none yet)."""
        return self._fitted_on

    def finished(self, cost_usd: float, completed: bool) -> Outlook:
        """The outlook at the job's end: done, unless it stopped to be resumed (a suspend, a lost service)."""
        if completed:
            return Outlook(1.0, 0.0, cost_usd, self.last.limit)
        return Outlook(self.last.progress, None, None, self.last.limit)

    def _pace(self, at: Standing, cost_usd: float) -> _Pace | None:
        """The pace since the standing kept last at or before the newest `PACE_SHARE` of the time since the first
        step closed, up to `at`."""
        since = at.elapsed - PACE_SHARE * (at.elapsed - self._kept[0][0].elapsed)
        first, first_cost, first_fitting = self._kept[
            max(bisect.bisect_right([k.elapsed for k, _, _ in self._kept], since) - 1, 0)]
        seconds = at.elapsed - first.elapsed
        training = seconds - (self._fitting - first_fitting)
        if training <= 0 or at.steps <= first.steps:
            return None
        return _Pace((at.steps - first.steps) / training, (at.cursor - first.cursor) / training,
                     (cost_usd - first_cost) / seconds)

    def _seconds_to(self, step: float, at: Standing, pace: _Pace) -> float:
        """Seconds from `at` to the close of step `step` at `pace`, with the fits to come. A projected stop the job
        went past without stopping is due at the next step close, at the soonest."""
        return self._with_fits((max(step, at.steps + 1) - at.steps) / pace.steps, pace)

    def _with_fits(self, seconds: float, pace: _Pace) -> float:
        """`seconds` of training, and the fits of the validation curve they will hold: one at each evaluation to
        come, at the newest fit's cost, as far as the share lets them. The supervisor's step close waits on a fit,
        so an ETA from the pace before the fits alone comes early."""
        if not self._fit_seconds:
            return seconds
        allowed = (max(self._credit, 0.0) + REFIT_SHARE * seconds) / (1.0 - REFIT_SHARE)
        return seconds + min(seconds * pace.steps / self._spacing * self._fit_seconds, allowed)

    def _limits(self, at: Standing, cost_usd: float, pace: _Pace | None) -> list[tuple[str, float, float]]:
        """(limit, fraction done, seconds left) of each limit set whose time left is known."""
        stop, out = self.stop, []
        if stop.max_seconds is not None:
            out.append(("maxSeconds", at.elapsed / stop.max_seconds, max(stop.max_seconds - at.elapsed, 0.0)))
        if pace is None:
            return out
        if stop.max_steps is not None and pace.steps > 0:
            out.append(("maxSteps", at.steps / stop.max_steps,
                        self._with_fits(max(stop.max_steps - at.steps, 0) / pace.steps, pace)))
        batches = None if stop.max_epochs is None else stop.max_epochs * at.n_batches
        if batches is not None and pace.batches > 0:
            out.append(("maxEpochs", at.cursor / batches,
                        self._with_fits(max(batches - at.cursor, 0.0) / pace.batches, pace)))
        if stop.budget_usd is not None and pace.dollars > 0:
            out.append(("budgetUSD", cost_usd / stop.budget_usd, max(stop.budget_usd - cost_usd, 0.0) / pace.dollars))
        return out

    def _project(self, evaluations: Sequence[tuple[int, float]], until: float | None) -> StopProjection | None:
        """The stop rule's projection, fitted again if an evaluation came and the fits have credit left."""
        started = self.clock()
        if not math.isnan(self._credit_at):
            self._credit = min(REFIT_BURST, self._credit + (started - self._credit_at) * REFIT_SHARE)
        self._credit_at = started
        if len(evaluations) > self._fitted_on and self._credit > 0:
            self._fitted_on = len(evaluations)
            self._projection = project_stop([s for s, _ in evaluations], [x for _, x in evaluations], self.stop,
                                            self.evaluate_every, until)
            self._fit_seconds = self.clock() - started
            self._fitting += self._fit_seconds
            self._credit -= self._fit_seconds
        return self._projection
