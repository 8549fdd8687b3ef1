"""Sparse logistic regression (MLLess' LR on hashed Criteo features).

Replica layout: ``params[:n_features]`` = weights `w`, ``params[n_features]`` =
bias `b`.  L2 is decoupled weight decay applied by the optimizer
(`weight_decay`), the only form that actually regularises under Adam.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mlless.data.batches import Batch, SparseBatch
from mlless.spec.config import ModelConfig
from mlless.training.kernels import logreg as _k
from mlless.training.models.base import Model, contiguous, expect_batch, required_dim

#: Decoupled weight decay; hashed Criteo has plenty of data per bucket, so barely any is needed.
DEFAULT_L2 = 1e-6


class LogisticRegression(Model):
    """sigmoid(w·x + b) over a CSR `SparseBatch`; loss metric mean BCE."""

    kind = "logistic-regression"
    shape_dims = ("n_features",)

    @classmethod
    def from_dims(cls, dims: Mapping[str, Any], config: ModelConfig | None, seed: int) -> LogisticRegression:
        """Needs ``n_features``."""
        return cls(int(required_dim(dims, "n_features", cls.kind)), config, seed)

    def __init__(self, n_features: int, config: ModelConfig | None = None, seed: int = 0) -> None:
        config = config or ModelConfig("logistic-regression")
        if n_features < 1:
            raise ValueError(f"n_features must be >= 1, got {n_features}")
        self.n_features = int(n_features)
        self.rank = int(config.rank)  # unused, kept so the config round-trips
        self.l2 = DEFAULT_L2 if config.l2 is None else float(config.l2)
        self.seed = seed  # zero init: every replica starts identical anyway
        super().__init__(self.n_features + 1)
        self.w = self.params[: self.n_features]
        self.b = self.params[self.n_features:]
        self._slots = np.full(self.n_features, -1, dtype=np.int32)

    @property
    def weight_decay(self) -> float:
        return self.l2

    def gradient(self, batch: Batch) -> tuple[np.ndarray, np.ndarray, float, int]:
        b = expect_batch(batch, SparseBatch, "logistic regression")
        idx, grad, loss = _k.logreg_gradient(self.params, contiguous(b.indptr, np.int64), contiguous(b.indices, np.int32),
                                             contiguous(b.values, np.float32), contiguous(b.labels, np.float32),
                                             self.n_features, self._slots)
        return idx, grad, float(loss), len(b)

    def adagrad_step(self, batch: Batch, g2: np.ndarray, lr: float, weight_decay: float) -> tuple[np.ndarray, np.ndarray, float, int]:
        b = expect_batch(batch, SparseBatch, "logistic regression")
        idx, delta, loss = _k.logreg_adagrad_step(self.params, g2, contiguous(b.indptr, np.int64), contiguous(b.indices, np.int32),
                                                  contiguous(b.values, np.float32), contiguous(b.labels, np.float32),
                                                  self.n_features, lr, weight_decay, self._slots)
        return idx, delta, float(loss), len(b)

    def _logits(self, b: SparseBatch) -> np.ndarray:
        return _k.logreg_logits(self.params, contiguous(b.indptr, np.int64), contiguous(b.indices, np.int32),
                                contiguous(b.values, np.float32), self.n_features)

    def predict(self, batch: Batch) -> np.ndarray:
        """Probabilities P(y = 1); features outside the model are ignored."""
        z = self._logits(expect_batch(batch, SparseBatch, "logistic regression"))
        return (0.5 * (1.0 + np.tanh(0.5 * z))).astype(np.float32)  # overflow-free sigmoid

    def evaluate(self, batch: Batch) -> tuple[float, int]:
        b = expect_batch(batch, SparseBatch, "logistic regression")
        return float(_k.bce_sum(self._logits(b), contiguous(b.labels, np.float32))), len(b)

    def dims(self) -> dict[str, Any]:
        return {"n_features": self.n_features}

    def config(self) -> ModelConfig:
        return ModelConfig("logistic-regression", rank=self.rank, l2=self.l2)
