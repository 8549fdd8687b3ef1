"""Sparse optimizers over a flat float32 replica.

`Optimizer.step(x, idx, grad, lr)` updates ``x[idx]`` in place and returns the
applied change, which the worker adds to its ISP accumulator
(`mlless.significance`).  All optimizers are *lazy*: their state (velocity,
Adam moments) is only read and written at ``idx``; an entry that a batch does
not touch keeps its weight and its state unchanged (its velocity is not
decayed), so a step costs O(len(idx)) no matter how large the model is.  Adam
still corrects its bias with the global step count, like TF's LazyAdam.

Weight decay is decoupled: each touched entry additionally moves by
``−lr·weight_decay·x_old``.  For Adam this is real regularisation, which
multiplying the gradient (what the original code did) is not.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np

from mlless.kernels import optim as _k

OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam")
LR_DECAYS = ("none", "sqrt-epoch")


@dataclass(frozen=True)
class OptimizerConfig:
    """Hyper-parameters of one optimizer; validated on construction."""

    type: str = "sgd"
    learning_rate: float = 0.01
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    weight_decay: float = 0.0
    lr_decay: str = "none"

    def __post_init__(self) -> None:
        if self.type not in OPTIMIZERS:
            raise ValueError(f"optimizer type must be one of {OPTIMIZERS}, got {self.type!r}")
        if self.lr_decay not in LR_DECAYS:
            raise ValueError(f"lr_decay must be one of {LR_DECAYS}, got {self.lr_decay!r}")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError("beta1 and beta2 must be in [0, 1)")
        if not self.epsilon > 0:
            raise ValueError("epsilon must be positive")
        if not self.weight_decay >= 0:
            raise ValueError("weight_decay must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def replace(self, **changes: Any) -> OptimizerConfig:
        return OptimizerConfig(**{**asdict(self), **changes})

    def lr_at(self, epoch: int) -> float:
        """Learning rate for a 1-based epoch: constant, or lr/√epoch (the paper's LR schedule)."""
        if self.lr_decay == "sqrt-epoch":
            return self.learning_rate / math.sqrt(max(1, epoch))
        return self.learning_rate


def default_optimizer(model_kind: str) -> OptimizerConfig:
    """Defaults that train well without tuning (see tests/test_models.py for the evidence).

    PMF: Nesterov, μ = 0.8 as in MLLess.  Our gradient is that of the mean
    *squared* error (factor 2 included), so lr = 4 equals the paper's lr = 8
    on Σe·∂/B.  LR: Adam with lr/√epoch decay.
    """
    if model_kind == "pmf":
        return OptimizerConfig(type="nesterov", learning_rate=PMF_LR, momentum=0.8)
    if model_kind == "logistic-regression":
        return OptimizerConfig(type="adam", learning_rate=LR_LR, lr_decay="sqrt-epoch")
    raise ValueError(f"unknown model kind {model_kind!r}")


PMF_LR = 4.0
# Every worker's Adam step is applied to every replica, so P workers move the shared model
# about P times as far per step; 0.01 generalises at P = 3-8 where 0.05 overfits sparse features.
LR_LR = 0.01


class Optimizer:
    """Applies sparse updates to a replica of ``size`` parameters and owns their state."""

    def __init__(self, size: int, config: OptimizerConfig) -> None:
        self.size = int(size)
        self.config = config
        self.t = 0  # number of steps taken; Adam's bias correction uses it
        self._buffers: dict[str, np.ndarray] = {}
        if config.type in ("momentum", "nesterov"):
            self._buffers["velocity"] = np.zeros(self.size, dtype=np.float32)
        elif config.type == "adam":
            self._buffers["m"] = np.zeros(self.size, dtype=np.float32)
            self._buffers["v"] = np.zeros(self.size, dtype=np.float32)

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
        if c.type == "sgd":
            _k.sgd_step(x, idx, grad, delta, lr_, c.weight_decay)
        elif c.type in ("momentum", "nesterov"):
            _k.momentum_step(x, idx, grad, delta, self._buffers["velocity"], lr_, c.momentum,
                             c.weight_decay, c.type == "nesterov")
        else:
            _k.adam_step(x, idx, grad, delta, self._buffers["m"], self._buffers["v"], lr_, c.beta1,
                         c.beta2, c.epsilon, c.weight_decay, self.t)
        return delta

    def state(self) -> dict[str, np.ndarray]:
        """Arrays to checkpoint (``np.savez``-able, no pickle)."""
        out = {name: buf.copy() for name, buf in self._buffers.items()}
        out["t"] = np.array([self.t], dtype=np.int64)
        return out

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore from `state`; shapes and dtypes must match this optimizer."""
        for name, buf in self._buffers.items():
            if name not in state:
                raise ValueError(f"optimizer state lacks '{name}' for a {self.config.type} optimizer")
            arr = np.asarray(state[name])
            if arr.shape != buf.shape or arr.dtype != np.float32:
                raise ValueError(f"optimizer state '{name}' has {arr.dtype}{arr.shape}, expected float32{buf.shape}")
            buf[:] = arr
        t = np.asarray(state.get("t", np.array([0])))
        if t.size != 1 or int(t.reshape(-1)[0]) < 0:
            raise ValueError("optimizer state 't' must be one non-negative count")
        self.t = int(t.reshape(-1)[0])


def make_optimizer(size: int, config: OptimizerConfig) -> Optimizer:
    """Build the optimizer for a replica of ``size`` parameters."""
    return Optimizer(size, config)
