"""When the job's stop rule fires, in samples trained: the stop rule's projection (`stopping/forecast.py`), which the
supervisor's ETA reads in steps, on a run's recorded loss curve in samples.

A run records its evaluations by samples trained; the job's rules count steps and evaluations at the job's own
cadence. So the evaluations are converted to steps at the job's samples per step, and, where the run evaluated at
another cadence, the rules count the recorded curve read (interpolated) at the job's, while the curve is fitted to
what the run recorded.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mlless.spec.job import StopConfig
from mlless.stopping.forecast import SLOW_POINTS, project_stop


def samples_when_stop_fires(stop: StopConfig, evaluations: Sequence[tuple[float, float]], *, samples_per_step: float,
                            interval_samples: float, limit_samples: float, same_cadence: bool) -> tuple[float, bool]:
    """(samples trained when the job stops, whether its loss rule stopped it rather than `limit_samples`), from a
    run's (samples, validation loss) `evaluations`: the rules count them as they are if they came at the job's
    cadence (`same_cadence`: patience counts evaluations), else the curve they trace read every `interval_samples`,
    the job's cadence, within the recording; past it, the stop is projected, the job evaluating every
    `interval_samples`. ValueError if the rule has not fired and the evaluations are too few to fit."""
    if stop.target_loss is None and not stop.patience:
        return limit_samples, False
    recorded = np.array(evaluations, dtype=np.float64)
    if same_cadence:
        seen = recorded[recorded[:, 0] <= limit_samples]
    else:
        grid = np.arange(1, int(min(recorded[-1, 0], limit_samples) // interval_samples) + 1) * interval_samples
        seen = np.column_stack([grid, np.interp(grid, recorded[:, 0], recorded[:, 1])])
    projection = project_stop(recorded[:, 0] / samples_per_step, recorded[:, 1], stop,
                              interval_samples / samples_per_step, limit_samples / samples_per_step,
                              counted=[(s / samples_per_step, x) for s, x in seen.tolist()], fewest=SLOW_POINTS)
    if projection is not None:
        return min(projection.step * samples_per_step, limit_samples), True
    if len(recorded) < SLOW_POINTS:
        raise ValueError(f"{len(recorded)} evaluations, fewer than the {SLOW_POINTS} a curve is fitted to")
    return limit_samples, False
