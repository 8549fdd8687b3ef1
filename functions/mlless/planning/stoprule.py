"""When the job's stop rule fires, in samples trained: replayed on a recorded loss curve, or on a fitted one.

The loss-based rules (`spec.stop.targetLoss`, `patience` with `minDelta`) are `ValidationWatch`'s
(`runtime/supervisor/stopping.py`), run here on evaluations instead of a live job, so the planner and the
supervisor cannot disagree on what the rule means. A pilot run is too short for its rule to fire: the validation
curve it recorded is fitted with the auto-tuner's reference curve (`autotuner/curves.py`, L(t) = 1/(θ0·t^θ1 + θ2)
+ θ3, here with t in samples) and the rule replayed on the curve at the job's evaluation cadence, with the run's
own evaluation noise added (the residuals' standard deviation around the fit, NOISE_DRAWS seeded draws, the
median of where it fires): on a real run patience fires once the curve improves by less than that noise an
evaluation, long before a smooth curve flattens below `minDelta`. The noisy replays are the supervisor's ETA's
own (`runtime/supervisor/forecast.median_future`), here in steps from scratch. The reference curve never turns up, so a run
that overfits early still stops sooner than the model says.

`samples_when_stop_fires` is the one place the planner turns a loss curve into the point where the rule fires.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from mlless.autotuner.curves import CurveFitError, fit_reference, fit_slow
from mlless.runtime.supervisor.forecast import median_future
from mlless.runtime.supervisor.stopping import ValidationWatch
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
    watch = ValidationWatch(stop.patience, stop.target_loss, stop.target_steps, stop.min_delta)
    for samples, loss in evaluations:
        step = int(samples / samples_per_step)
        watch.observe(step, loss, _NO_PARAMS)
        if watch.target_held(step) or watch.patience_exhausted():
            return samples
    return None


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

    The rule is replayed first on the recorded `evaluations` if they came at the job's cadence (`same_cadence`:
    patience counts evaluations); if it does not fire on them, on the curve fitted to them, evaluated every
    `interval_samples` (the job's cadence) up to `limit_samples`.
    """
    if not has_loss_rule(stop):
        return limit_samples, False
    if same_cadence:
        fired = replay(stop, [e for e in evaluations if e[0] <= limit_samples], samples_per_step)
        if fired is not None:
            return fired, True
    try:
        curve = fit_curve(evaluations)
    except CurveFitError as exc:
        raise ValueError(f"{len(evaluations)} evaluations: {exc}") from None
    recorded = np.array(evaluations, dtype=np.float64)
    resid = recorded[:, 1] - np.asarray(curve(recorded[:, 0]))
    noise = float(np.std(resid, ddof=1)) if len(resid) > 1 else 0.0
    # The futures start from scratch (step 0, no evaluation seen), counted in steps as the rule counts them.
    watch = ValidationWatch(stop.patience, stop.target_loss, stop.target_steps, stop.min_delta)
    step, _ = median_future(watch, lambda steps: curve(steps * samples_per_step), noise, 0,
                            interval_samples / samples_per_step, limit_samples / samples_per_step,
                            futures=NOISE_DRAWS, seed=NOISE_SEED)
    return (limit_samples, False) if step == math.inf else (min(step * samples_per_step, limit_samples), True)
