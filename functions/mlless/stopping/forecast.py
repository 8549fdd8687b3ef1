"""When a job's stop rule will fire, projected from its validation curve.

`project_stop` turns a loss curve into "the step at which the target-loss or the patience rule ends the job": the
supervisor's progress and ETA read it (`runtime/supervisor/eta.py`), and the planner reads it on a run's recorded
curve, converted from samples to steps (`planning/stoprule.py`). It replays the evaluations seen through the
supervisor's own `ValidationWatch` (if the rule fired among them, there it fired), fits the curve the auto-tuner
fits (`mlless.autotuner.curves.fit_reference`, 1/(θ0·t^θ1 + θ2) + θ3) to the raw validation losses, extends it one
evaluation at a time, and counts the projected evaluations with the same rules, which smooth them as they do live:
the projection stops where the rule would, by the same code. `benchmarks/forecast.py` compares ways of doing
this on recorded curves; three choices come from it:
- the raw losses are fitted, not the smoothed ones the rules read: their lag behind a falling curve made every
  projected evaluation too high, so the futures stopped improving, and the projection stopping, too early;
- for patience, only the newest 80 % of the evaluations (`RECENT_SHARE`, at least `MIN_EVALUATIONS`) are fitted:
  a fit of the whole curve is held by its fast early fall, while patience fires where the late slope drowns in
  the noise, and that slope is slower (the 1M ratings) or turning up (MovieLens). A fit of the newest half swung
  with each evaluation on its few points, its projections leaping past the real stop and back. A target loss is
  projected from the whole curve: it asks where the trend crosses a level, often far ahead, which a newer share's
  fit estimates with more scatter (tests/test_eta.py's noisy curves: the median error at half-way went from 0.13
  to 0.46 on the newest half);
- the projected evaluations come at the spacing the newest ones came at (`SPACING_GAPS`), not every
  `evaluation.everySteps`: patience counts evaluations, and PMF evaluates at its rounds' ends, every 32-80 steps
  under `everySteps` 25.

A fitted curve decreases for ever, so under patience alone its trend would never stop on a small `minDelta`. A
real curve stops once its fall per evaluation drowns in the evaluations' noise: the smoothed loss then makes no
new best for `patience` evaluations in a row, at a step that is itself random. So `FUTURES` futures are replayed:
the fitted trend plus Gaussian noise with the scatter of the newest half of the evaluations about it (`_noise`; a
fixed seed: the same evaluations give the same projection), each counted by the rules from where they stand; the
projection is the median future's stop. The scatter of every evaluation about the fit, in its place, is swollen
by the early ones a fit of the newest share misses: on tests/test_eta.py's curves the band then held none of the
real patience stops. With 9 futures the median itself moved by evaluations from one fit to the next; 31 steady
it, and the fits stay within the supervisor's `eta.REFIT_SHARE` of its time.

The futures' spread is the projection's band (`BAND`): where the median stop cannot be known closely, at half-way
through a job whose curve has yet to turn, the band says by how much (`benchmarks/forecast.py` counts how often
it holds the real stop of a recorded job).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from mlless.autotuner.curves import CurveFitError, FittedCurve, fit_reference, fit_slow
from mlless.stopping.rules import ValidationWatch
from mlless.spec.job import StopConfig

__all__ = ["FutureStops", "StopProjection", "evaluation_spacing", "median_future", "project_stop"]

#: Evaluations the reference curve's fit needs (`fit_reference`'s least), and the slow curve's (`fit_slow`'s).
MIN_EVALUATIONS, SLOW_POINTS = 8, 4
#: The share of the evaluations, the newest, that the curve is fitted to when patience is the only loss rule.
RECENT_SHARE = 0.8
#: The projected evaluations' spacing is the median of the newest this many gaps between evaluations (0: every
#: `evaluation.everySteps` steps, as `benchmarks/forecast.py` compares).
SPACING_GAPS = 5
#: Before a curve can be fitted, a patience is projected to run out once this many evaluations in a row made no new
#: best. One is often noise while the curve still falls (a new best comes at the next evaluation, and the ETA comes
#: early); more than two were no more accurate on `benchmarks/forecast.py`'s curves, and two projects soonest.
STALE_BEFORE_FIT = 2
#: The projection gives up this many evaluations past the newest one: a rule that far away is no forecast.
HORIZON_EVALUATIONS = 500
#: How many noisy futures of the fitted curve are replayed.
FUTURES = 31
#: The projection's band runs from the futures' stop at this quantile to the one at 1 - BAND.
BAND = 0.1
_NO_PARAMS = np.zeros(0, np.float32)


@dataclass(frozen=True)
class StopProjection:
    """Where the target-loss or patience rule is projected to end the job."""

    step: float  # the step close at which the rule fires
    rule: str  # "targetLoss" or "patience"
    curve: FittedCurve | None  # None: fired among the evaluations seen, or too few to fit and projected from the best
    noise: float  # the evaluations' scatter about the fit (loss units) its futures were given
    futures: tuple[float, ...] = ()  # each future's stop, in order (inf: past the limit or horizon); () with no fit

    @property
    def band(self) -> tuple[float, float] | None:
        """The futures' early and late stop (`BAND`), None with no futures."""
        return band_of(self.futures) if self.futures else None


@dataclass(frozen=True)
class FutureStops:
    """Where the rules stop the futures of a fitted curve: the median future's stop, and every future's."""

    step: float  # inf: the median future does not stop within the limit
    rule: str  # "targetLoss" or "patience" ("" with no stop)
    futures: tuple[float, ...]  # in order


def band_of(futures: Sequence[float]) -> tuple[float, float]:
    """The stops at the `BAND` and 1 - `BAND` quantiles of `futures` (in order)."""
    return futures[round(BAND * (len(futures) - 1))], futures[round((1.0 - BAND) * (len(futures) - 1))]


def project_stop(steps: Sequence[float], losses: Sequence[float], stop: StopConfig, evaluate_every: float,
                 until_step: float | None = None, *, counted: Sequence[tuple[float, float]] | None = None,
                 fewest: int = MIN_EVALUATIONS) -> StopProjection | None:
    """The step at which `stop`'s target loss or patience fires, for a job whose evaluations so far scored `losses`
    at `steps` (`evaluate_every`, its `evaluation.everySteps`, spaces them until two have come); None when neither
    rule is set, or the rule does not fire before `until_step` (another limit's step, if any) or the horizon.

    The rules count `counted`, (step, loss) evaluations, where they are not these (a run read at another job's
    cadence: the curve is fitted to what it recorded, the rules count what the job would see); if they fired
    among them, that is the projection. A curve of `fewest` to `MIN_EVALUATIONS` evaluations is fitted with the
    slow curve (`fit_slow`): a planner's pilot may have no more (a protocol with rounds evaluates at their ends
    only), while the ETA waits for the reference curve. Before a curve can be fitted, only a patience already
    counting (`STALE_BEFORE_FIT` evaluations) is projected: to fire `patience` evaluations after the best."""
    if (stop.target_loss is None and not stop.patience) or evaluate_every <= 0:
        return None
    points = [(float(s), float(x)) for s, x in zip(steps, losses) if s > 0 and math.isfinite(x)]
    if not points:
        return None
    seen = points if counted is None else [(float(s), float(x)) for s, x in counted]
    watch = ValidationWatch(stop.patience, stop.target_loss, stop.target_steps, stop.min_delta)
    for step, loss in seen:  # the rules' state now, replayed: the same code the supervisor runs
        watch.observe(step, loss, _NO_PARAMS)  # type: ignore[arg-type]  # a planner's steps are fractional
        if watch.target_held(step) or watch.patience_exhausted():
            return StopProjection(step, "targetLoss" if watch.target_held(step) else "patience", None, 0.0)
    first = seen[-1][0] if seen else 0.0
    t = np.array([s for s, _ in points])
    raw = np.array([x for _, x in points])
    spacing = evaluation_spacing([s for s, _ in seen], evaluate_every)
    share = 1.0 if stop.target_loss is not None else RECENT_SHARE
    recent = slice(-max(MIN_EVALUATIONS, math.ceil(share * t.size)), None)
    try:
        curve = _fit(t[recent], raw[recent], fewest)
    except CurveFitError:  # too few evaluations yet, or a curve no fit holds
        if watch.stale < STALE_BEFORE_FIT or watch.patience_left is None:
            return None
        # The evaluations since the best are taken to go on not improving (a model that overfits early, as the
        # clicks of benchmarks/forecast.py do, stops before a curve can be fitted).
        step = first + watch.patience_left * spacing
        return StopProjection(step, "patience", None, 0.0) if until_step is None or step <= until_step else None
    noise = _noise(t, raw, curve)
    last = first + HORIZON_EVALUATIONS * spacing
    found = median_future(watch, curve, noise, first, spacing, last if until_step is None else min(until_step, last),
                          futures=FUTURES, seed=len(points))
    if found.step == math.inf:
        return None
    return StopProjection(found.step, found.rule, curve, noise, found.futures)


def _fit(steps: np.ndarray, losses: np.ndarray, fewest: int) -> FittedCurve:
    """The reference curve fitted to these evaluations, or the slow one to fewer than `MIN_EVALUATIONS` (from
    `fewest`); CurveFitError where neither can be."""
    if steps.size >= MIN_EVALUATIONS:
        return fit_reference(steps, losses, min_points=MIN_EVALUATIONS)
    return fit_slow(steps, losses, min_points=max(fewest, SLOW_POINTS))


def _noise(steps: np.ndarray, losses: np.ndarray, curve: FittedCurve) -> float:
    """The scatter about the fitted curve of the newest half of the evaluations, which its futures are given: the
    noise where patience fires, not the early misfit of a curve fitted to the newest share only."""
    tail = slice(steps.size // 2, None)
    return float(np.std(losses[tail] - np.asarray(curve(steps[tail]), dtype=np.float64)))


def evaluation_spacing(steps: Sequence[float], evaluate_every: int) -> float:
    """The steps between a job's evaluations to come: the median of the newest `SPACING_GAPS` gaps between those at
    `steps` (`evaluate_every`, its `evaluation.everySteps`, until two have come)."""
    if len(steps) < 2 or not SPACING_GAPS:
        return float(evaluate_every)
    return max(1.0, float(np.median(np.diff(np.asarray(steps[-SPACING_GAPS - 1:], dtype=np.float64)))))


def median_future(watch: ValidationWatch, trend: Callable[[np.ndarray], np.ndarray], noise: float, first: float,
                  evaluate_every: float, last: float, *, futures: int, seed: int) -> FutureStops:
    """Where `watch`'s rules, as they stand after the evaluation at step `first`, stop the job in the median of
    `futures` futures, and in each of them: `trend` (step -> validation loss) evaluated every
    `evaluate_every` steps up to `last`, plus Gaussian noise of deviation `noise` (seeded by `seed`: the same inputs
    give the same answer; one future when `noise` is 0). A future that does not stop by `last` stops at inf."""
    ahead = first + evaluate_every * np.arange(1, int((last - first) // evaluate_every) + 1, dtype=np.float64)
    smooth = np.asarray(trend(ahead), dtype=np.float64) if ahead.size else ahead
    rng = np.random.default_rng(seed)
    losses = smooth + rng.normal(0.0, noise, (futures if noise > 0 else 1, smooth.size))
    steps = ahead.astype(int).tolist()
    stops = sorted(_replay(watch, first, steps, row, evaluate_every, last)
                   for row in watch.smoothed.following(losses).tolist())
    step, rule = stops[len(stops) // 2]
    return FutureStops(step, rule, tuple(s for s, _ in stops))


def _replay(watch: ValidationWatch, first: float, steps: list[int], smoothed: list[float], evaluate_every: float,
            last: float) -> tuple[float, str]:
    """Where `watch`'s rules stop on projected evaluations at `steps` whose smoothed losses are `smoothed`,
    counted as `ValidationWatch.observe` counts (the watch itself left as it was): (step, rule), or (inf, "")
    within `last`. A future read evaluation by evaluation through `observe`, on a copy of the watch each, was
    half a projection's cost."""
    best, stale, since = watch.best_smoothed, watch.stale, watch.below_since
    for step, loss in zip([first, *steps], [None, *smoothed]):
        if loss is not None:
            best, stale = watch.counted(loss, best, stale)
            since = watch.run_below(step, loss, since)
        # The target is read at every step close: it fires before the next evaluation if it has held long enough.
        held = None if since is None else max(step, since + watch.target_steps)
        if held is not None and held < step + evaluate_every and held <= last:
            return held, "targetLoss"
        if watch.patience is not None and stale >= watch.patience:
            return step, "patience"
    return math.inf, ""
