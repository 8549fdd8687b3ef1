"""Multinomial logistic regression (softmax) over hashed features: Cirrus's softmax model.

The classes are the data set's distinct labels (`mlless prepare --labels classes` numbers them 0 … K − 1 and records
the file's values in `feature_stats.label_values`; the manifest's `feature_stats.label_classes`, sorted): a row's
label is its class's value, and class c is the c-th. Replica
layout (kernels/softmax.pyx): feature-major K weights per feature, then the K biases. L2 is decoupled weight decay
applied by the optimizer, as for the linear models.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mlless.data.batches import Batch, SparseBatch
from mlless.spec.config import ModelConfig
from mlless.spec.models import model_type
from mlless.training.kernels import softmax as _k
from mlless.training.models.base import Model, contiguous, expect_batch, register, required_dim
from mlless.training.models.linear import DEFAULT_L2


@register
class Softmax(Model):
    """softmax(W·x + b) over a CSR `SparseBatch`; loss metric mean cross-entropy."""

    type = model_type("softmax")
    shape_dims = ("n_features",)

    @classmethod
    def from_dims(cls, dims: Mapping[str, Any], config: ModelConfig | None, seed: int) -> Softmax:
        """Needs ``n_features`` and ``classes`` (the sorted distinct labels)."""
        return cls(int(required_dim(dims, "n_features", cls.kind)), required_dim(dims, "classes", cls.kind), config)

    def __init__(self, n_features: int, classes: Any, config: ModelConfig | None = None) -> None:
        config = config or ModelConfig(self.kind)
        self.classes = np.asarray(classes, dtype=np.float32)
        if n_features < 1:
            raise ValueError(f"n_features must be >= 1, got {n_features}")
        if self.classes.ndim != 1 or len(self.classes) < 2 or np.any(np.diff(self.classes) <= 0):
            raise ValueError("softmax needs at least 2 classes, as sorted distinct labels")
        self.n_features, self.k = int(n_features), len(self.classes)
        self.l2 = DEFAULT_L2 if config.l2 is None else float(config.l2)
        super().__init__((self.n_features + 1) * self.k)
        self._slots = np.full(self.n_features, -1, dtype=np.int32)

    @property
    def weight_decay(self) -> float:
        return self.l2

    def class_of(self, labels: np.ndarray) -> np.ndarray:
        """Each label's class index (int32); ValueError naming a label that is no class."""
        idx = np.minimum(np.searchsorted(self.classes, labels), self.k - 1)
        wrong = self.classes[idx] != labels
        if wrong.any():
            raise ValueError(f"label {labels[np.argmax(wrong)]:g} is none of the model's classes")
        return idx.astype(np.int32)

    def _csr(self, batch: Batch) -> tuple[SparseBatch, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The batch and its CSR arrays and classes as the kernels take them."""
        b = expect_batch(batch, SparseBatch, self.kind)
        return (b, contiguous(b.indptr, np.int64), contiguous(b.indices, np.int32), contiguous(b.values, np.float32),
                self.class_of(b.labels))

    def gradient(self, batch: Batch) -> tuple[np.ndarray, np.ndarray, float, int]:
        b, indptr, indices, values, classes = self._csr(batch)
        idx, grad, loss = _k.softmax_gradient(self.params, indptr, indices, values, classes, self.n_features, self.k,
                                              self._slots)
        return idx, grad, float(loss), len(b)

    def normalized_step(self, batch: Batch, state: Mapping[str, np.ndarray], lr: float, weight_decay: float,
                        workers: int) -> tuple[np.ndarray, np.ndarray, float, int]:
        b, indptr, indices, values, classes = self._csr(batch)
        idx, delta, loss = _k.normalized_step(self.params, state["g2"], state["scale"], state["rows"], state["norm"],
                                              indptr, indices, values, classes, self.n_features, self.k, lr,
                                              weight_decay, workers, self._slots)
        return idx, delta, float(loss), len(b)

    def logits(self, batch: Batch) -> np.ndarray:
        """The (rows, K) logits; features outside the model are ignored."""
        b = expect_batch(batch, SparseBatch, self.kind)
        return _k.softmax_logits(self.params, contiguous(b.indptr, np.int64), contiguous(b.indices, np.int32),
                                 contiguous(b.values, np.float32), self.n_features, self.k)

    def scores(self, batch: Batch) -> dict[str, float]:
        b = expect_batch(batch, SparseBatch, self.kind)
        return {"accuracy": float(np.mean(self.logits(b).argmax(axis=1) == self.class_of(b.labels)))}

    def predict(self, batch: Batch) -> np.ndarray:
        """The (rows, K) class probabilities, classes in `classes` order."""
        z = self.logits(batch)
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        return (p / p.sum(axis=1, keepdims=True)).astype(np.float32)

    def evaluate(self, batch: Batch) -> tuple[float, int]:
        b = expect_batch(batch, SparseBatch, self.kind)
        z = self.logits(b)
        top = z.max(axis=1)
        lse = top + np.log(np.exp(z - top[:, None]).sum(axis=1))
        return float((lse - z[np.arange(len(b)), self.class_of(b.labels)]).sum()), len(b)

    def dims(self) -> dict[str, Any]:
        return {"n_features": self.n_features, "classes": self.classes.tolist()}

    def config(self) -> ModelConfig:
        return ModelConfig(self.kind, self.l2)
