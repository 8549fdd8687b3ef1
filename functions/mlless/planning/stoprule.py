"""When the job's stop rule fires, in samples trained: replayed on a recorded loss curve, or on a fitted one.

The loss-based rules (`spec.stop.targetLoss`, `patience` with `minDelta`) are `ValidationWatch`'s
(`stopping/rules.py`), run here on evaluations instead of a live job, so the planner and the
supervisor cannot disagree on what the rule means. Where a run ended before its rule fired (a pilot cut at its
time, a run with a shorter limit), the validation curve it recorded is fitted with the auto-tuner's reference curve (`autotuner/curves.py`, L(t) = 1/(θ0·t^θ1 + θ2)
+ θ3, here with t in samples) and the rule replayed on the curve at the job's evaluation cadence, with the run's
own evaluation noise added (the residuals' standard deviation around the fit, NOISE_DRAWS seeded draws, the
median of where it fires): on a real run patience fires once the curve improves by less than that noise an
evaluation, long before a smooth curve flattens below `minDelta`. The noisy replays are the supervisor's ETA's
own (`runtime/supervisor/forecast.median_future`), here in steps. The reference curve never turns up: a curve that
turned up within the recording is taken to make no new best (`samples_when_stop_fires`), but one that turns up only
after it still stops sooner than the model says.

`samples_when_stop_fires` is the one place the planner turns a loss curve into the point where the rule fires.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from mlless.autotuner.curves import CurveFitError, fit_reference, fit_slow
from mlless.stopping.forecast import median_future
from mlless.stopping.rules import ValidationWatch
from mlless.spec.job import StopConfig

_NO_PARAMS = np.zeros(0)
#: Noisy replays of a fitted curve, and their seed (a plan is the same each time it is made from the same runs).
NOISE_DRAWS, NOISE_SEED = 31, 0
#: Evaluations the fitted curves need (`fit_reference`'s and `fit_slow`'s minimum).
REFERENCE_POINTS, SLOW_POINTS = 8, 4


def has_loss_rule(stop: StopConfig) -> bool:
    """Whether a loss-based rule (target or patience) can end the job, besides its length limits."""
    return stop.target_loss is not None or stop.patience is not None


def replay(stop: StopConfig, evaluations: Sequence[tuple[float, float]], samples_per_step: float) -> float | None:
    """The samples at the evaluation (samples, validation loss) where the job's loss rule fires, or None."""
    return _observe(stop, evaluations, samples_per_step)[1]


def _observe(stop: StopConfig, evaluations: Sequence[tuple[float, float]],
             samples_per_step: float) -> tuple[ValidationWatch, float | None]:
    """The rules after these evaluations, and the samples at the one where they fired (None: not yet)."""
    watch = ValidationWatch(stop.patience, stop.target_loss, stop.target_steps, stop.min_delta)
    for samples, loss in evaluations:
        step = int(samples / samples_per_step)
        watch.observe(step, loss, _NO_PARAMS)
        if watch.target_held(step) or watch.patience_exhausted():
            return watch, samples
    return watch, None


def fit_curve(evaluations: Sequence[tuple[float, float]]) -> Callable[[float], float]:
    """The validation loss as a function of samples trained, fitted on a run's evaluations; CurveFitError if the
    evaluations cannot support a fit (too few, flat)."""
    xs = [s for s, _ in evaluations]
    ys = [v for _, v in evaluations]
    if len(xs) >= REFERENCE_POINTS:
        return fit_reference(xs, ys, min_points=REFERENCE_POINTS)
    return fit_slow(xs, ys, min_points=SLOW_POINTS)


def samples_when_stop_fires(stop: StopConfig, evaluations: Sequence[tuple[float, float]], *, samples_per_step: float,
                            interval_samples: float, limit_samples: float, same_cadence: bool) -> tuple[float, bool]:
    """(samples trained when the job stops, whether its loss rule stopped it rather than `limit_samples`).

    The rule is replayed first on the recorded `evaluations`: as they are if they came at the job's cadence
    (`same_cadence`: patience counts evaluations), else on the recorded curve read (interpolated) every
    `interval_samples`, the job's cadence, within the recording. If it does not fire on them, it goes on, from
    the state they left it in, on the curve fitted to them, evaluated every `interval_samples` up to
    `limit_samples`. Unless the recording's smoothed loss already stands above its best (the curve turned up: the
    model overfits): then no new best is taken to come, and patience runs out as many evaluations on as it has
    left, as `forecast.project_stop` projects a patience already counting. The fitted curve only falls, so it
    would hand the futures new bests that an overfitting run does not make (a 3-epoch pilot of the 200k clicks
    turns up after its first epoch; continued on the fitted curve, its patience fired at 8.7 epochs, the job's at
    5.2; now at 6.1).
    """
    if not has_loss_rule(stop):
        return limit_samples, False
    recorded = np.array(evaluations, dtype=np.float64)
    if same_cadence:
        seen = recorded[recorded[:, 0] <= limit_samples]
    else:
        grid = np.arange(1, int(min(recorded[-1, 0], limit_samples) // interval_samples) + 1) * interval_samples
        seen = np.column_stack([grid, np.interp(grid, recorded[:, 0], recorded[:, 1])])
    watch, fired = _observe(stop, seen.tolist(), samples_per_step)
    if fired is not None:
        return fired, True
    first = seen[-1, 0] if len(seen) else 0.0
    if watch.stale and watch.patience_left is not None:
        # Turned up: no new best is made, and patience runs out as many evaluations on as it has left.
        fires = first + watch.patience_left * interval_samples
        return (fires, True) if fires <= limit_samples else (limit_samples, False)
    try:
        curve = fit_curve(evaluations)
    except CurveFitError as exc:
        raise ValueError(f"{len(evaluations)} evaluations: {exc}") from None
    resid = recorded[:, 1] - np.asarray(curve(recorded[:, 0]))
    noise = float(np.std(resid, ddof=1)) if len(resid) > 1 else 0.0
    step = median_future(watch, lambda steps: curve(steps * samples_per_step), noise, int(first / samples_per_step),
                         interval_samples / samples_per_step, limit_samples / samples_per_step,
                         futures=NOISE_DRAWS, seed=NOISE_SEED).step
    return (limit_samples, False) if step == math.inf else (min(step * samples_per_step, limit_samples), True)
