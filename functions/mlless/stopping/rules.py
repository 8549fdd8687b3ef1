"""When a job stops: its stop rules, early stopping on the validation loss, and the best model seen so far.

`StopRules` reads the job's history at each step close (steps, epochs,
seconds, cost, the training or the smoothed validation loss) and names the
rule that ends the job, if one does. The supervisor evaluates a replica snapshot every `evaluation.everySteps` steps.
`ValidationWatch` takes those evaluations in order and answers three questions:

* which snapshot was best (the model a job should hand back: the last one can
  be worse once a model overfits),
* whether the *smoothed* validation loss has stopped improving for
  `stop.patience` evaluations,
* whether it has stayed at or below `stop.targetLoss` for `stop.targetSteps` steps,
* whether training diverged: an evaluation that is not finite, or a smoothed loss `DIVERGENCE_FACTOR` times its
  best. The job then ends with `STOP_DIVERGED`, a failure, and hands back the best snapshot: a run whose replicas blew
  up (a learning rate far too high, an insider's oversized updates) must not end as a success.

The smoothing is a short causal EWMA (span 3) over the newest 3 evaluations
only: one snapshot can land on a bad mini-batch, and a stop rule should not fire
on that, nor fail to fire because of one lucky one.  For patience, a decrease of
the smoothed loss counts as an improvement when it takes it below its best by more
than `stop.minDelta` of that best (as Keras's EarlyStopping's `min_delta`): small
decreases add up until they pass it, but a loss that wanders around its best by a
hair no longer restarts the count each time it dips.

The window is what lets the target rule fire on a model that dips under its
target shortly before it overfits.  A plain bias-corrected EWMA keeps
every evaluation, the first with the most weight of all at the start: under
SSP the first snapshot can be taken while the stale updates still oscillate
(the 200k clicks at P = 3: 0.74 at step 25, where BSP has 0.59), and that one
value held the smoothed loss at 0.595 or more, above the 0.590 target, while
two of the next three evaluations were at or below it; after them the model
overfit until `maxSeconds`.  Within the window the EWMA weights are as before.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from mlless.contract import (
    STOP_BUDGET, STOP_DIVERGED, STOP_MAX_EPOCHS, STOP_MAX_SECONDS, STOP_MAX_STEPS, STOP_NO_IMPROVEMENT, STOP_TARGET_LOSS,
)
from mlless.smoothing import RecentEwma
from mlless.spec.job import StopConfig

#: EWMA span of the validation loss the stop rules read, and how many of the newest evaluations it reads.
SMOOTHING_SPAN = 3
#: A smoothed validation loss this many times its best means training diverged: overfitting moves it by percents.
DIVERGENCE_FACTOR = 3.0


@dataclass(frozen=True)
class Best:
    """The best evaluated snapshot: its step, its (unsmoothed) validation loss and its parameters."""

    step: int
    loss: float
    params: np.ndarray


class ValidationWatch:
    def __init__(self, patience: int | None, target_loss: float | None, target_steps: int,
                 min_delta: float = 0.0) -> None:
        self.patience = patience or None  # the spec's 0 is off, as None
        self.min_delta = min_delta
        self.target_loss = target_loss
        self.target_steps = target_steps
        self.smoothed = RecentEwma(SMOOTHING_SPAN)
        self.best: Best | None = None
        self._best_smoothed = math.inf  # the smoothed loss when it last improved by more than min_delta
        self._stale = 0  # evaluations since then
        self._below_since: int | None = None  # step of the first evaluation of the current run at or below target
        self.diverged = False
        self.evaluations: list[tuple[int, float]] = []  # (step, loss) of the finite evaluations, for the ETA (eta.py)

    def observe(self, step: int, loss: float, params: np.ndarray) -> None:
        """One evaluation of the snapshot of `step`; `params` is copied only when it is the best so far."""
        if not math.isfinite(loss):
            self.diverged = True
            self._below_since = None
            return
        self.evaluations.append((step, loss))
        if self.best is None or loss < self.best.loss:
            self.best = Best(step, loss, params.copy())
        smoothed = self.smoothed.update(loss)
        self._best_smoothed, self._stale = self.counted(smoothed, self._best_smoothed, self._stale)
        if self._stale:
            self.diverged = smoothed > DIVERGENCE_FACTOR * self._best_smoothed
        self._below_since = self.run_below(step, smoothed, self._below_since)

    def counted(self, smoothed: float, best: float, stale: int) -> tuple[float, int]:
        """Patience's count after a smoothed loss, from `best` (the smoothed loss when it last improved by more
        than minDelta) and `stale` (evaluations since): the two of them after it. `observe` counts with it, and the
        ETA replays its projected futures through it without a watch each (forecast.py)."""
        return (smoothed, 0) if smoothed < best * (1.0 - self.min_delta) else (best, stale + 1)

    def run_below(self, step: int, smoothed: float, since: int | None) -> int | None:
        """The step the current run of smoothed losses at or below the target began, after one at `step` (None:
        above it, or no target), from `since`, where it stood before."""
        if self.target_loss is None or smoothed > self.target_loss:
            return None
        return step if since is None else since

    @property
    def below_since(self) -> int | None:
        """The step of the first evaluation of the current run at or below the target, if the newest one is."""
        return self._below_since

    @property
    def best_smoothed(self) -> float:
        """The smoothed loss when it last improved by more than minDelta (inf before the first evaluation)."""
        return self._best_smoothed

    @property
    def stale(self) -> int:
        """Evaluations since the smoothed loss last improved by more than minDelta."""
        return self._stale

    def patience_exhausted(self) -> bool:
        return self.patience is not None and self._stale >= self.patience

    @property
    def patience_left(self) -> int | None:
        """Evaluations until patience runs out if none of them improves (None without patience): where the ETA and
        the planner project a patience already counting to fire."""
        return None if self.patience is None else max(0, self.patience - self._stale)

    def target_held(self, step: int) -> bool:
        """The smoothed validation loss has been at or below the target since `targetSteps` steps before `step`."""
        return self._below_since is not None and step - self._below_since >= self.target_steps


@dataclass(frozen=True)
class Standing:
    """Where the job stands when a step closes, as far as the stop rules read it."""

    steps: int  # closed steps, those before a suspend included
    cursor: int  # mini-batches taken
    n_batches: int  # mini-batches in an epoch
    train_loss: float
    elapsed: float  # seconds since the supervisor started


class StopRules:
    """`spec.stop`, applied at each step close; a stop asked for from outside wins over every rule.

    With evaluation on, the target loss and the patience read the smoothed validation loss (`watch`);
    without it, the target reads the training loss of the closed steps.
    """

    def __init__(self, stop: StopConfig, evaluate_every: int | None) -> None:
        self.stop = stop
        self.evaluating = bool(evaluate_every)
        self.watch = ValidationWatch(stop.patience if self.evaluating else None,
                                     stop.target_loss if self.evaluating else None, stop.target_steps, stop.min_delta)
        self.below_target = 0  # steps the training loss has stayed at or below the target (evaluation off)
        self.requested: str | None = None

    def request(self, reason: str) -> None:
        """End the job at the next step close (thread-safe: one assignment)."""
        self.requested = reason

    def check(self, at: Standing, cost_usd: Callable[[], float]) -> str | None:
        """The reason the job stops at this step close, or None; `cost_usd` is asked only for the budget rule."""
        stop = self.stop
        if stop.target_loss is not None and not self.evaluating:
            self.below_target = self.below_target + 1 if at.train_loss <= stop.target_loss else 0
        if self.requested is not None:
            return self.requested
        if self.watch.diverged:
            return STOP_DIVERGED
        if self.watch.target_held(at.steps) or (stop.target_loss is not None and self.below_target >= stop.target_steps):
            return STOP_TARGET_LOSS
        if self.watch.patience_exhausted():
            return STOP_NO_IMPROVEMENT
        if stop.max_steps is not None and at.steps >= stop.max_steps:
            return STOP_MAX_STEPS
        if stop.max_epochs is not None and at.cursor >= stop.max_epochs * at.n_batches:
            return STOP_MAX_EPOCHS
        if stop.max_seconds is not None and at.elapsed >= stop.max_seconds:
            return STOP_MAX_SECONDS
        if stop.budget_usd is not None and cost_usd() >= stop.budget_usd:
            return STOP_BUDGET
        return None
