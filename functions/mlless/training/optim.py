"""Sparse optimizers over a flat float32 replica.

`Optimizer.step(x, idx, grad, lr)` updates ``x[idx]`` in place and returns the
applied change, which the worker adds to its ISP accumulator
(`mlless.training.significance`).  All optimizers are *lazy*: their state (velocity,
Adam moments) is only read and written at ``idx``; an entry that a batch does
not touch keeps its weight and its state unchanged (its velocity is not
decayed), so a step costs O(len(idx)) no matter how large the model is.  Adam
still corrects its bias with the global step count, like TF's LazyAdam.

Weight decay is decoupled: each touched entry additionally moves by
``−lr·weight_decay·x_old``.  For Adam this is real regularisation, which
multiplying the gradient (what the original code did) is not.

``adam`` and ``adamw`` are therefore one rule, Loshchilov and Hutter's AdamW
(decay decoupled from the adaptive step, scaled by the learning rate as
PyTorch's AdamW scales it), run by one kernel (`kernels/optim.pyx`,
``adam_step``).  They differ only in the decay a job gets when
``spec.model.l2`` is unset: under ``adam`` the model's default (0 for a
network, 1e-6 for the linear models), under ``adamw`` 0.01, PyTorch's AdamW
default (`mlless.spec.config.default_l2`; pmf keeps its l2 in its loss, and
gets no decoupled decay from either).  Both take ``weight_decay`` from the
config; a bare ``OptimizerConfig(type="adamw")`` has 0, as ``adam``'s.

`adagrad` differs in kind: it updates the replica after every sample of the
mini-batch, with per-row (PMF, as LIBMF) or per-coordinate (LR, as Vowpal
Wabbit's adaptive updates) AdaGrad step sizes, so one mini-batch is B updates
instead of one averaged step.  The model owns that fused kernel
(`Model.adagrad_step`); the optimizer owns its accumulators.  It is PMF's
default (see `mlless.spec.models`).  `normalized` is Vowpal Wabbit's
per-sample rule for the linear models (`Model.normalized_step`): AdaGrad
whose steps are scaled by each feature's largest magnitude seen, so a
feature's units do not matter.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from mlless.spec.config import OptimizerConfig
from mlless.spec.pairings import PER_SAMPLE_OPTIMIZERS
from mlless.training.kernels import optim as _k

if TYPE_CHECKING:  # only for annotations: models do not depend on optimizers, nor these on them at run time
    from mlless.data.batches import Batch
    from mlless.training.models.base import Model

#: The rules `adam_step` runs: one rule, two default decays (the module's docstring).
ADAM = ("adam", "adamw")
#: AdaGrad's accumulators start here, as LIBMF's do: the first steps are at most lr, not lr/√(g²) = lr/|g|.
ADAGRAD_INITIAL = 1.0


class Optimizer:
    """Applies sparse updates to a replica of ``size`` parameters and owns their state.

    ``accumulator_size`` is the length of AdaGrad's accumulator, which the model
    decides (`Model.accumulator_size`); it defaults to one per parameter.
    """

    def __init__(self, size: int, config: OptimizerConfig, accumulator_size: int | None = None) -> None:
        self.size = int(size)
        self.config = config
        self.t = 0  # number of steps taken; Adam's bias correction uses it
        self._buffers: dict[str, np.ndarray] = {}
        if config.type == "adagrad":
            self._buffers["g2"] = np.full(self.size if accumulator_size is None else int(accumulator_size),
                                          ADAGRAD_INITIAL, dtype=np.float32)
        elif config.type == "normalized":  # Vowpal Wabbit's: G and s start at 0, N and t too; rows counts
            for name in ("g2", "scale", "rows"):
                self._buffers[name] = np.zeros(self.size, dtype=np.float32)
            self._buffers["norm"] = np.zeros(2, dtype=np.float64)
        elif config.type in ("momentum", "nesterov"):
            self._buffers["velocity"] = np.zeros(self.size, dtype=np.float32)
        elif config.type in ADAM:
            self._buffers["m"] = np.zeros(self.size, dtype=np.float32)
            self._buffers["v"] = np.zeros(self.size, dtype=np.float32)

    def update(self, model: Model, batch: Batch, lr: float,
               workers: int = 1) -> tuple[np.ndarray, np.ndarray, float, int]:
        """Train ``model``'s replica on one mini-batch in place: (idx, applied delta, loss_sum, n).

        Mini-batch rules take the batch's mean gradient and step once; ``adagrad``
        runs the model's per-sample kernel; a model with a rule of its own (`Model.own_step`) runs that
        instead.  ``delta`` is what the significance
        filter accumulates. ``workers`` is how many replicas' updates are summed:
        ``normalized`` shares its steps among them.
        """
        own = model.own_step(batch, lr, workers)
        if own is not None:
            self.t += 1
            return own
        if self.config.type == "adagrad":
            self.t += 1
            return model.adagrad_step(batch, self._buffers["g2"], lr, self.config.weight_decay)
        if self.config.type == "normalized":
            self.t += 1
            return model.normalized_step(batch, self._buffers, lr, self.config.weight_decay, workers)
        idx, grad, loss_sum, n = model.gradient(batch)
        return idx, self.step(model.params, idx, grad, lr), loss_sum, n

    def step(self, x: np.ndarray, idx: np.ndarray, grad: np.ndarray, lr: float | None = None) -> np.ndarray:
        """Update ``x[idx]`` in place with ``grad``; return the applied delta (float32, len(idx)).

        ``lr`` overrides the configured learning rate (use `OptimizerConfig.lr_at`
        for the schedule).  ``idx`` must not repeat an index.
        """
        if x.shape != (self.size,):
            raise ValueError(f"replica has shape {x.shape}, optimizer expects ({self.size},)")
        c = self.config
        lr_ = float(c.learning_rate if lr is None else lr)
        idx = np.ascontiguousarray(idx, dtype=np.int32)
        grad = np.ascontiguousarray(grad, dtype=np.float32)
        delta = np.empty(idx.shape[0], dtype=np.float32)
        self.t += 1
        if c.type in PER_SAMPLE_OPTIMIZERS:
            raise ValueError(f"{c.type} updates per sample: use Optimizer.update(model, batch, lr)")
        if c.type == "sgd":
            _k.sgd_step(x, idx, grad, delta, lr_, c.weight_decay)
        elif c.type in ("momentum", "nesterov"):
            _k.momentum_step(x, idx, grad, delta, self._buffers["velocity"], lr_, c.momentum,
                             c.weight_decay, c.type == "nesterov")
        else:  # ADAM
            _k.adam_step(x, idx, grad, delta, self._buffers["m"], self._buffers["v"], lr_, c.beta1,
                         c.beta2, c.epsilon, c.weight_decay, self.t)
        return delta

    def state(self) -> dict[str, np.ndarray]:
        """Arrays to checkpoint (``np.savez``-able, no pickle)."""
        out = {name: buf.copy() for name, buf in self._buffers.items()}
        out["t"] = np.array([self.t], dtype=np.int64)
        return out

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore from `state`, all or nothing; shapes and dtypes must match this optimizer."""
        arrays = {}
        for name, buf in self._buffers.items():
            if name not in state:
                raise ValueError(f"optimizer state lacks '{name}' for a {self.config.type} optimizer")
            arrays[name] = arr = np.asarray(state[name])
            if arr.shape != buf.shape or arr.dtype != buf.dtype:
                raise ValueError(f"optimizer state '{name}' has {arr.dtype}{arr.shape}, expected {buf.dtype}{buf.shape}")
        t = np.asarray(state.get("t", np.array([0])))
        if t.size != 1 or int(t.reshape(-1)[0]) < 0:
            raise ValueError("optimizer state 't' must be one non-negative count")
        for name, arr in arrays.items():
            self._buffers[name][:] = arr
        self.t = int(t.reshape(-1)[0])
