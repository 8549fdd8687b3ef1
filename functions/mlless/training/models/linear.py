"""Sparse linear models over hashed features: w·x + b, one class per loss (kernels/linear.pyx).

MLLess' logistic regression, the linear SVM and linear regression share the replica layout
``params[:n_features]`` = weights `w`, ``params[n_features]`` = bias `b`, and every loop: each class names its
kernel `Loss` and how a margin becomes a prediction. L2 is decoupled weight decay applied by the optimizer
(`weight_decay`), the only form that actually regularises under Adam.
"""
from __future__ import annotations

from typing import Any, ClassVar, Mapping

import numpy as np

from mlless.data.batches import Batch, SparseBatch
from mlless.spec.config import ModelConfig
from mlless.spec.models import model_type
from mlless.training.kernels import linear as _k
from mlless.training.models.base import Model, binary_scores, contiguous, expect_batch, register, required_dim
from mlless.training.normal_equations import NormalEquations

#: Decoupled weight decay; hashed Criteo has plenty of data per bucket, so barely any is needed.
DEFAULT_L2 = 1e-6


class LinearModel(Model):
    """z = w·x + b over a CSR `SparseBatch`, trained on the loss of its subclass."""

    shape_dims = ("n_features",)
    loss_fn: ClassVar[_k.Loss]

    @classmethod
    def from_dims(cls, dims: Mapping[str, Any], config: ModelConfig | None, seed: int) -> LinearModel:
        """Needs ``n_features``."""
        return cls(int(required_dim(dims, "n_features", cls.kind)), config, seed)

    def __init__(self, n_features: int, config: ModelConfig | None = None, seed: int = 0) -> None:
        config = config or ModelConfig(self.kind)
        if n_features < 1:
            raise ValueError(f"n_features must be >= 1, got {n_features}")
        self.n_features = int(n_features)
        self.l2 = DEFAULT_L2 if config.l2 is None else float(config.l2)
        self.seed = seed  # zero init: every replica starts identical anyway
        super().__init__(self.n_features + 1)
        self.w = self.params[: self.n_features]
        self.b = self.params[self.n_features:]
        self._slots = np.full(self.n_features, -1, dtype=np.int32)

    @property
    def weight_decay(self) -> float:
        return self.l2

    def _csr(self, batch: Batch) -> tuple[SparseBatch, np.ndarray, np.ndarray, np.ndarray]:
        b = expect_batch(batch, SparseBatch, self.kind)
        return b, contiguous(b.indptr, np.int64), contiguous(b.indices, np.int32), contiguous(b.values, np.float32)

    def gradient(self, batch: Batch) -> tuple[np.ndarray, np.ndarray, float, int]:
        b, indptr, indices, values = self._csr(batch)
        idx, grad, loss = _k.gradient(self.loss_fn, self.params, indptr, indices, values,
                                      contiguous(b.labels, np.float32), self.n_features, self._slots)
        return idx, grad, float(loss), len(b)

    def adagrad_step(self, batch: Batch, g2: np.ndarray, lr: float, weight_decay: float) -> tuple[np.ndarray, np.ndarray, float, int]:
        b, indptr, indices, values = self._csr(batch)
        idx, delta, loss = _k.adagrad_step(self.loss_fn, self.params, g2, indptr, indices, values,
                                           contiguous(b.labels, np.float32), self.n_features, lr, weight_decay,
                                           self._slots)
        return idx, delta, float(loss), len(b)

    def normalized_step(self, batch: Batch, state: Mapping[str, np.ndarray], lr: float, weight_decay: float,
                        workers: int) -> tuple[np.ndarray, np.ndarray, float, int]:
        b, indptr, indices, values = self._csr(batch)
        idx, delta, loss = _k.normalized_step(self.loss_fn, self.params, state["g2"], state["scale"], state["rows"],
                                              state["norm"], indptr, indices, values, contiguous(b.labels, np.float32),
                                              self.n_features, lr, weight_decay, workers, self._slots)
        return idx, delta, float(loss), len(b)

    def margins(self, batch: Batch) -> np.ndarray:
        """w·x + b per row (float64); features outside the model are ignored."""
        _, indptr, indices, values = self._csr(batch)
        return _k.logits(self.params, indptr, indices, values, self.n_features)

    def predict(self, batch: Batch) -> np.ndarray:
        """The margins, as the model's output."""
        return self.margins(batch).astype(np.float32)

    def evaluate(self, batch: Batch) -> tuple[float, int]:
        b = expect_batch(batch, SparseBatch, self.kind)
        return float(_k.loss_sum(self.loss_fn, self.margins(b), contiguous(b.labels, np.float32))), len(b)

    def dims(self) -> dict[str, Any]:
        return {"n_features": self.n_features}

    def config(self) -> ModelConfig:
        return ModelConfig(self.kind, self.l2)


class BinaryClassifier(LinearModel):
    """A linear model of labels 0/1, whose positive margins are class 1."""

    def scores(self, batch: Batch) -> dict[str, float]:
        return binary_scores(self.margins(batch), expect_batch(batch, SparseBatch, self.kind).labels)


@register
class LogisticRegression(BinaryClassifier):
    """sigmoid(w·x + b); loss metric mean BCE."""

    type = model_type("logistic-regression")
    loss_fn = _k.Log()

    def predict(self, batch: Batch) -> np.ndarray:
        """Probabilities P(y = 1)."""
        return (0.5 * (1.0 + np.tanh(0.5 * self.margins(batch)))).astype(np.float32)  # overflow-free sigmoid


@register
class LinearSVM(BinaryClassifier):
    """The hinge loss on labels 0/1 as the classes −1/+1; predictions are margins (positive: class 1)."""

    type = model_type("svm")
    loss_fn = _k.Hinge()


@register
class LinearRegression(LinearModel):
    """Squared loss on real labels; loss metric RMSE."""

    type = model_type("linear-regression")
    loss_fn = _k.Squared()

    def __init__(self, n_features: int, config: ModelConfig | None = None, seed: int = 0) -> None:
        config = config or ModelConfig(self.kind)
        super().__init__(n_features, config, seed)
        # No replica sees more features than the model has: capped so, the bound passes `load_model`'s check that
        # every integer of a model file is within its parameters.
        self.exact_features = min(int(config.options["exactFeatures"]), self.n_features)
        self._exact = NormalEquations(self.n_features, self.exact_features)

    def own_step(self, batch: Batch, lr: float, workers: int) -> tuple[np.ndarray, np.ndarray, float, int] | None:
        """The exact step of the normal equations while the features seen number at most ``exactFeatures``
        (training/normal_equations.py); the optimizer's rule beyond."""
        return self._exact.step(self.params, expect_batch(batch, SparseBatch, self.kind), workers)

    def config(self) -> ModelConfig:
        return ModelConfig.of(self.kind, self.l2, exactFeatures=self.exact_features)

    @classmethod
    def from_dims(cls, dims: Mapping[str, Any], config: ModelConfig | None, seed: int) -> LinearModel:
        """Needs ``n_features``; the bias starts at ``mean_label`` if given, as PMF's predictions start at the mean
        rating: labels far from 0 would otherwise take the optimizer's steps many epochs to reach."""
        model = super().from_dims(dims, config, seed)
        model.b[:] = float(dims.get("mean_label", 0.0))
        return model
