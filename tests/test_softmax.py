"""Softmax at its default optimizer (the normalized updates, kernels/softmax.pyx) on a real table with raw columns:
scikit-learn's LogisticRegression's accuracy on standardised columns within 0.01, at P = 1 and 2, and the same with
every column ×1000 (#47)."""
from __future__ import annotations

import numpy as np
import pytest

from mlless.data.batches import SparseBatch
from mlless.spec.config import default_optimizer
from mlless.training.models.softmax import Softmax
from mlless.training.optim import Optimizer

sklearn = pytest.importorskip("sklearn")
EPOCHS, BATCH = 10, 64


def as_batch(X: np.ndarray, y: np.ndarray) -> SparseBatch:
    n, d = X.shape
    return SparseBatch(np.arange(0, n * d + 1, d, dtype=np.int64), np.tile(np.arange(d, dtype=np.int32), n),
                       X.astype(np.float32).ravel(), y.astype(np.float32))


def train(X: np.ndarray, y: np.ndarray, workers: int) -> Softmax:
    """`workers` replicas at softmax's default optimizer, each on its own mini-batch a step, every replica adding
    the others' applied updates (BSP's sum, as a job's workers do); replica 0."""
    models = [Softmax(X.shape[1], np.unique(y)) for _ in range(workers)]
    config = default_optimizer("softmax", workers)
    optimizers = [Optimizer(m.size, config.replace(weight_decay=m.weight_decay)) for m in models]
    rng = np.random.default_rng(0)
    for epoch in range(EPOCHS):
        order = rng.permutation(len(X))
        batches = [order[i:i + BATCH] for i in range(0, len(X), BATCH)]
        for step in range(0, len(batches), workers):
            sent = [opt.update(m, as_batch(X[b], y[b]), config.lr_at(epoch + 1), workers)[:2]
                    for m, opt, b in zip(models, optimizers, batches[step:step + workers])]
            for p, model in enumerate(models):
                for q, (idx, delta) in enumerate(sent):
                    if q != p:
                        model.params[idx] += delta
    return models[0]


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)  # pixel counts 0-16, as they are
    return tuple(train_test_split(X, y, test_size=0.25, random_state=0, stratify=y))


@pytest.mark.parametrize("workers", [1, 2])
def test_softmax_defaults_meet_logistic_regression_on_raw_columns_whatever_their_units(digits, workers):
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    X, Xv, y, yv = digits
    scaler = StandardScaler().fit(X)
    peer = LogisticRegression(max_iter=2000).fit(scaler.transform(X), y).score(scaler.transform(Xv), yv)
    accuracy = {times: train(X * times, y, workers).scores(as_batch(Xv * times, yv))["accuracy"]
                for times in (1.0, 1000.0)}
    assert accuracy[1.0] >= peer - 0.01, (accuracy, peer)
    assert accuracy[1000.0] == pytest.approx(accuracy[1.0], abs=0.01)
