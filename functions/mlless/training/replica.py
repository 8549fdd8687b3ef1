"""A replica: one worker's copy of the model and everything that trains it, without I/O.

It owns the parameters, the optimizer's state and the significance filter's
accumulator, and keeps them consistent: every change to the parameters goes
through a method here, so the filter always knows the replica it judges
significance against.  The worker only moves frames around it; the tests
and the throughput benchmarks call the same methods, so they measure the
step the worker runs.

Replicas of one job differ only by their unsent accumulators: replica −
pending is the state every peer shares.  That is why snapshots carry the
pending entries beside the parameters.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from mlless.data.batches import Batch
from mlless.protocol import layouts
from mlless.protocol.framing import FrameError
from mlless.protocol.messages import check_bounded
from mlless.training.models import Model
from mlless.spec.config import OptimizerConfig
from mlless.training.optim import Optimizer
from mlless.training.rounds import RoundAccumulator
from mlless.training.significance import SignificanceFilter

#: What keeps a replica's unsent updates: the ISP filter, or a round's accumulator.
Accumulator = SignificanceFilter | RoundAccumulator


class TrainingDiverged(ArithmeticError):
    """The replica's loss stopped being finite, or its update left the bound frames carry; continuing would only
    publish garbage."""



@dataclass(frozen=True)
class StepResult:
    """One local step: the entries to publish, the batch's loss, and where the time went."""

    indices: np.ndarray
    values: np.ndarray
    loss_sum: float
    samples: int
    compute_seconds: float
    filter_seconds: float


class Replica:
    """``model`` trained by the optimizer ``optimizer`` describes, with an ISP filter at threshold ``v``.

    With ``audit`` set, the replica also sums every update it computed (the
    supervisor's conservation check, MLLESS_AUDIT).
    """

    def __init__(self, model: Model, optimizer: OptimizerConfig, v: float, audit: bool = False,
                 accumulator: Accumulator | None = None) -> None:
        self.model = model
        self.config = optimizer.replace(weight_decay=model.weight_decay)
        self.optimizer = Optimizer(model.size, self.config, model.accumulator_size)
        # A protocol that publishes once per round brings its own (`training/rounds.py`), over model.params.
        self.filter = accumulator or SignificanceFilter(model.params, v)
        self.contribution = np.zeros(model.size, np.float64) if audit else None
        #: A proximal step a protocol adds to each shared local step (ADMM's pull towards the consensus,
        #: sync/protocols/admm.py): given the step's entries and learning rate, it moves them and returns the move.
        self.proximal: Callable[[np.ndarray, float], np.ndarray] | None = None
        #: How many replicas' updates are summed (the worker sets the job's live workers before each step, or 1 under a
        #: protocol that averages them: `SyncStrategy.sums_updates`).
        self.workers = 1

    @property
    def params(self) -> np.ndarray:
        return self.model.params

    def step(self, batch: Batch, epoch: float, t: int, share: bool = True, select: bool = True) -> StepResult:
        """Train on ``batch`` and select what to send at step ``t``. ``epoch`` sets the learning rate
        (`OptimizerConfig.lr_at`): 1-based and fractional, the job's progress halfway through ``batch``
        (`mlless.data.feed.Schedule.progress`); an integer is the start of that epoch.

        Without ``share`` (a worker alone in its job) the update stays in the
        replica and out of the accumulator, and nothing is selected: a worker
        that joins later starts from replica − pending with it included.
        Without ``select`` (a local step inside a round of model averaging) the
        update is accumulated, and nothing is selected yet.
        """
        started = time.perf_counter()
        if not share:
            self.filter.before_alone()
        lr = self.config.lr_at(epoch)
        idx, delta, loss_sum, samples = self.optimizer.update(self.model, batch, lr, self.workers)
        if self.proximal is not None and share:
            delta = delta + self.proximal(idx, lr)
        if not math.isfinite(loss_sum):
            raise TrainingDiverged(f"loss is {loss_sum} at step {t}; {self._advice(epoch)}")
        if self.contribution is not None:
            self.contribution[idx] += delta  # the optimizers' idx never repeats
        computed = time.perf_counter()
        selected = layouts.no_pending()
        if not share:
            self.filter.alone(idx, delta)
        elif not select:
            self.filter.accumulate(idx, delta)
        else:
            selected = self.filter.step(idx, delta, t)
            try:  # peers would reject the frame; say why here, where the advice is known
                check_bounded("the update's values", selected[1])
            except FrameError as exc:
                raise TrainingDiverged(f"{exc} at step {t}; {self._advice(epoch)}") from None
        return StepResult(*selected, float(loss_sum), int(samples), computed - started, time.perf_counter() - computed)

    def gradient(self, batch: Batch, t: int) -> StepResult:
        """The mean gradient of ``batch`` at the replica, not applied (gradient averaging publishes it, and every
        replica then `descend`s by the workers' mean, sync/protocols/gradients.py)."""
        started = time.perf_counter()
        idx, grad, loss_sum, samples = self.model.gradient(batch)
        if not math.isfinite(loss_sum):
            raise TrainingDiverged(f"loss is {loss_sum} at step {t}; lower spec.optimizer.learningRate")
        try:
            check_bounded("the gradient's values", grad)
        except FrameError as exc:
            raise TrainingDiverged(f"{exc} at step {t}; lower spec.optimizer.learningRate") from None
        return StepResult(idx, grad, float(loss_sum), int(samples), time.perf_counter() - started, 0.0)

    def descend(self, indices: np.ndarray, gradient: np.ndarray, epoch: float, appliers: int = 1) -> None:
        """One optimizer step by ``gradient`` (the workers' mean), in place. Each of the ``appliers`` replicas takes
        the same step, which moves the shared state once: each counts its share of it as its contribution
        (MLLESS_AUDIT)."""
        delta = self.optimizer.step(self.params, indices, gradient, self.config.lr_at(epoch))
        if self.contribution is not None:
            self.contribution[indices] += delta / appliers

    def _advice(self, epoch: float) -> str:
        """What to change after a diverging step: the L2 penalty when it overshoots by itself (its gradient moves a
        parameter by learning rate x l2 of itself, so at 1 or more it overshoots zero) and is beyond any sensible
        penalty (1 or more: the defaults are below 0.1), else the learning rate."""
        lr = self.config.lr_at(epoch)
        l2 = self.model.config().l2 or 0.0
        if l2 >= 1.0 and lr * l2 >= 1.0:
            return f"lower spec.model.l2 ({l2:g} at learning rate {lr:g} overshoots every step)"
        return "lower spec.optimizer.learningRate"

    def apply(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Add a peer's update (or a leaver's unsent accumulator), all or nothing; ValueError names a bad index."""
        self.model.apply_update(indices, values)
        self.filter.touched(indices, values)

    def correct(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Move the replica by a correction of its own published update (model averaging keeps a share of it): the
        correction is part of this replica's contribution to the shared state, as the update was (MLLESS_AUDIT)."""
        self.apply(indices, values)
        if self.contribution is not None:
            self.contribution[indices] += values

    def unpublish(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Entries this replica published that no peer will apply go back to its accumulator (they are in the
        replica already)."""
        self.filter.unsent(indices, values)

    def pending_count(self) -> int:
        return self.filter.pending_count()

    def snapshot(self, optimizer: bool = False) -> dict[str, np.ndarray]:
        """The arrays that describe this replica (`layouts.replica_arrays`); with ``optimizer``, enough to resume training exactly."""
        return layouts.replica_arrays(self.model.params, self.filter.pending(), self.contribution,
                                      self.optimizer.state() if optimizer else None)

    def restore(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Continue from a `snapshot` of this job's replica; absent optimizer state starts empty."""
        self.model.set_params(arrays[layouts.PARAMS])
        self.filter.restore(*layouts.pending(arrays))
        state = layouts.optimizer_state(arrays)
        if state:
            self.optimizer.load_state(state)
        if self.contribution is not None and layouts.CONTRIBUTION in arrays:
            self.contribution[:] = arrays[layouts.CONTRIBUTION]

    def adopt_shared(self, donor: Mapping[str, np.ndarray]) -> None:
        """Start from the state a donor's snapshot shares with its peers: its replica minus its pending entries."""
        self.model.set_params(donor[layouts.PARAMS])
        self.filter.restore(*layouts.no_pending())
        indices, values = layouts.pending(donor)
        self.apply(indices, -values)
        if state := layouts.optimizer_state(donor):  # replicas that step one optimizer together (`share_optimizer`)
            self.optimizer.load_state(state)
