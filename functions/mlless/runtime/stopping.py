"""Early stopping on the validation loss, and the best model seen so far.

The supervisor evaluates a replica snapshot every `evaluation.everySteps` steps.
`ValidationWatch` takes those evaluations in order and answers three questions:

* which snapshot was best (the model a job should hand back: the last one can
  be worse once a model overfits),
* whether the *smoothed* validation loss has stopped improving for
  `stop.patience` evaluations,
* whether it has stayed at or below `stop.targetLoss` for `stop.targetSteps` steps.

The smoothing is a short causal EWMA (span 3): one snapshot can land on a bad
mini-batch, and a stop rule should not fire on that, nor fail to fire because
of one lucky one.  Any decrease of the smoothed loss counts as an improvement
(no minimum delta): the smoothing already absorbs the noise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mlless.autotuner.smoothing import OnlineEwma

#: EWMA span of the validation loss the stop rules read.
SMOOTHING_SPAN = 3


@dataclass(frozen=True)
class Best:
    """The best evaluated snapshot: its step, its (unsmoothed) validation loss and its parameters."""

    step: int
    loss: float
    params: np.ndarray


class ValidationWatch:
    def __init__(self, patience: int | None, target_loss: float | None, target_steps: int) -> None:
        self.patience = patience
        self.target_loss = target_loss
        self.target_steps = target_steps
        self.smoothed = OnlineEwma(SMOOTHING_SPAN)
        self.best: Best | None = None
        self._best_smoothed = math.inf
        self._stale = 0  # evaluations since the smoothed loss last improved
        self._below_since: int | None = None  # step of the first evaluation of the current run at or below target

    def observe(self, step: int, loss: float, params: np.ndarray) -> None:
        """One evaluation of the snapshot of `step`; `params` is copied only when it is the best so far."""
        if not math.isfinite(loss):
            self._stale += 1
            self._below_since = None
            return
        if self.best is None or loss < self.best.loss:
            self.best = Best(step, loss, params.copy())
        smoothed = self.smoothed.update(loss)
        if smoothed < self._best_smoothed:
            self._best_smoothed = smoothed
            self._stale = 0
        else:
            self._stale += 1
        if self.target_loss is not None and smoothed <= self.target_loss:
            if self._below_since is None:
                self._below_since = step
        else:
            self._below_since = None

    def patience_exhausted(self) -> bool:
        return self.patience is not None and self._stale >= self.patience

    def target_held(self, step: int) -> bool:
        """The smoothed validation loss has been at or below the target since `targetSteps` steps before `step`."""
        return self._below_since is not None and step - self._below_since >= self.target_steps
