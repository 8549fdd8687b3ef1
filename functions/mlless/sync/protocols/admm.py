"""Consensus ADMM (Boyd et al. 2011, §7.1), as LambdaML runs it for convex models: averaging's rounds
(`averaging.py`), with each worker's local steps pulled towards the consensus and a dual variable per worker.

Worker k of the n that publish in a round keeps a dual vector u_k (local: it never travels). With z the shared
state at the round's start (`RoundAccumulator.shared`), one round is scaled-form ADMM:

* x-update: the H = `spec.sync.localSteps` local steps approximately minimise f_k(x) + ρ/2 ‖x − z + u_k‖² from x = z.
  After each step of the model's optimizer, the entries the step touched take the proximal step of the penalty,
  x ← x − (ηρ / (1 + ηρ)) (x − z + u_k), exact for the penalty at learning rate η, so stable at any ρ
  (`spec.sync.rho`). An entry the round never touched has the penalty alone to minimise: its x-update is
  z − u_k exactly.
* The worker publishes d_k = x_k − z + u_k, which is 0 on the untouched entries, so only the touched ones travel.
* z-update: z ← z + Σ_k d_k / n, the mean of x_k + u_k over the round's n workers. Unlike averaging's mean over
  the replicas that changed an entry, every worker counts: one that did not touch an entry holds it at the
  consensus, as its subproblem asks. Every worker reads the same frames and sets its replica to the new z, so
  replicas stay the shared state plus their pending entries.
* u-update: u_k ← u_k + x_k − z_new, which is d_k − Δz on what the worker published and −Δz elsewhere.

The loss's L2 stays each worker's decoupled weight decay. Alone in the job (P = 1, or the last worker after a
scale-in), a worker's consensus is its own replica: its dual is zero and no penalty applies. A leaver's dual
variables leave with it; the survivors' then no longer sum to zero, and the next round's z-update restores that
(each round's duals sum to Σ d_k − n Δz = 0). A resumed job, a joiner and a re-invoked worker start with zero
duals, from which ADMM converges as from any other. Everything else (leavers' merges, snapshots, checkpoints,
the MLLESS_AUDIT check: each worker's contribution of a round is its d_k / n) is averaging's.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from mlless.data.batches import Batch
from mlless.protocol.messages import Close, Update
from mlless.sync.base import WorkerHalf, register
from mlless.sync.protocols.averaging import Averaging
from mlless.training.replica import StepResult


class AdmmHalf(WorkerHalf):
    """Local steps with ADMM's proximal pull; at a round's close, z is the mean over the round's workers of x + u."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dual = np.zeros_like(self.replica.params)
        self.replica.proximal = self._proximal
        # The accumulator's shared state is stale during a step that follows steps alone (`RoundAccumulator.
        # before_alone`): that one step is not pulled.
        self.was_alone = False

    def _proximal(self, idx: np.ndarray, lr: float) -> np.ndarray:
        if self.was_alone:
            return np.zeros(len(idx), dtype=np.float32)
        x, z = self.replica.params, self.replica.filter.shared
        pull = lr * self.strategy.config.rho
        move = (-pull / (1.0 + pull) * (x[idx] - z[idx] + self.dual[idx])).astype(np.float32)
        x[idx] += move
        return move

    def train(self, batch: Batch, epoch: float, step: int, alone: bool) -> StepResult:
        if alone:
            self.dual[:] = 0.0  # alone, x = z: the dual of a one-worker consensus is zero
        result = super().train(batch, epoch, step, alone)
        self.was_alone = alone
        if not len(result.indices):
            return result
        return dataclasses.replace(result, values=result.values + self.dual[result.indices])

    def combine(self, close: Close, updates: list[Update]) -> None:
        own = [p for p in self.exchange.outbox if p.step == close.step]
        workers = len(close.updates)  # the round's senders, this worker's included
        if not workers:
            return
        step_z = np.zeros_like(self.dual, dtype=np.float64)
        for update in updates:
            step_z[update.indices] += update.values
        super().combine(close, [Update(u.sender, u.step, u.indices, u.values / workers) for u in updates])
        for published in own:
            step_z[published.indices] += published.values
            moved = published.values - self.dual[published.indices]  # x_k − z, already in the replica
            self.replica.correct(published.indices, published.values / workers - moved)
        step_z /= workers
        self.dual[:] = -step_z
        for published in own:
            self.dual[published.indices] += published.values

    def withdraw_unread(self, after: int) -> None:
        """Frames no peer will apply: what they moved the replica by (x_k − z, their values less the dual) goes
        back to the accumulator."""
        for published in self.exchange.unread(after):
            self.replica.unpublish(published.indices, published.values - self.dual[published.indices])


@register
class Admm(Averaging):
    """Averaging's rounds; the local steps solve ADMM's subproblem and the close averages x + u over the round."""

    name = "admm"
    worker_half = AdmmHalf
