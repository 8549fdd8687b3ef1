"""Asynchronous successive halving (ASHA) as a stopping rule, for the local sweep and the operator alike.

Rung k sits at `minResource × reductionFactor^k` steps or epochs. When a running trial reaches a rung, its value
there (its best validation loss up to the rung) is compared with the values of every trial that reached the rung so
far: if it is not within the best 1/η of them (above their (1 - 1/η) quantile), the trial is stopped. A rung
judges only once it holds η values (`min_peers`): the best 1/η of fewer is one comparison with one other trial
(on the MovieLens sweep of benchmarks/forecast.py that cut the grid's best configuration, 0.0004 behind the first trial
at 0.67 epochs), so the first η - 1 trials at a rung go on. This is the stopping form of ASHA (Li et al. 2020) that
Ray Tune's AsyncHyperBandScheduler runs (Ray judges from a rung's second value): no trial waits for others, so
`maxConcurrentTrials` slots stay busy.

The state is per trial (the rungs it has passed and its values at the rungs it reached), so the operator can keep it
in the sweep's status and decide again after a restart.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from mlless.sweep.manifest import EarlyStopping


@dataclass
class TrialProgress:
    """What ASHA knows of a trial: its rung values (value k: its best validation loss when it reached rung k) and the rungs it passed; a trial that is not `running` is only a peer."""

    name: str
    running: bool
    passed: int = 0
    values: list[float] = field(default_factory=list)


def level(rule: EarlyStopping, k: int) -> float:
    """The resource (steps or epochs) of rung k."""
    return rule.min_resource * rule.reduction_factor ** k


def rung_values(rule: EarlyStopping, curve: Iterable[tuple[float, float | None]],
                limit: float | None = None) -> list[float]:
    """A trial's values at the rungs its `curve` reached: (resource, validation loss or None) points in order, the
    value at rung k its lowest validation loss when it reached the rung (a rung counts as reached at the first point
    past it with a validation loss known: evaluations come every few steps). Rungs at or past `limit`, where the
    trial's own stop rule ends it, are never reached: there is nothing left to save."""
    values: list[float] = []
    best = math.inf
    for resource, loss in curve:
        if loss is not None and math.isfinite(loss):
            best = min(best, loss)
        reach(rule, values, resource, best, limit)
    return values


def reach(rule: EarlyStopping, values: list[float], resource: float, best: float, limit: float | None = None) -> None:
    """Append `best` (the trial's lowest validation loss so far; inf if none is known yet) to its rung `values` for
    each rung past them that `resource` reached, short of `limit`: one point of `rung_values`, for a caller (the
    operator) that sees a trial's latest status only and keeps its values between looks."""
    while (math.isfinite(best) and resource >= level(rule, len(values))
           and (limit is None or level(rule, len(values)) < limit)):
        values.append(best)


def cutoff(rule: EarlyStopping, peers: Sequence[float]) -> float:
    """The value a trial must not exceed to go on past a rung where `peers` (itself included) are recorded."""
    return float(np.percentile(peers, 100.0 * (1.0 - 1.0 / rule.reduction_factor)))


def min_peers(rule: EarlyStopping) -> int:
    """The values a rung must hold (the trial's own included) before it stops anyone: η, rounded up."""
    return math.ceil(rule.reduction_factor)


def judge(rule: EarlyStopping, trials: Sequence[TrialProgress]) -> dict[str, int]:
    """The running trials to stop, each with the rung it lost at; the others' `passed` move past their new rungs."""
    stopped: dict[str, int] = {}
    for trial in trials:
        if not trial.running:
            continue
        while trial.passed < len(trial.values):
            k = trial.passed
            peers = [t.values[k] for t in trials if len(t.values) > k]
            if len(peers) >= min_peers(rule) and trial.values[k] > cutoff(rule, peers):
                stopped[trial.name] = k
                break
            trial.passed += 1
    return stopped
