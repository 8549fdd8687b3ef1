"""Probabilistic matrix factorisation with biases (MLLess' PMF).

Prediction: U_u·M_i + b_u + b_i + μ, where μ is the training set's global mean
rating (a constant from the dataset manifest, not a parameter).

Layout of the flat replica (see `mlless.training.kernels.pmf`): ``n_users + n_items``
rows of width ``rank + 1``; users first, each row = factors then bias.  `U`,
`M`, `bu`, `bi` are strided views into `params`.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from mlless.data.batches import Batch, RatingsBatch
from mlless.spec.config import ModelConfig
from mlless.spec.models import model_type
from mlless.training.kernels import pmf as _k
from mlless.training.models.base import Model, contiguous, expect_batch, register, required_dim

#: Bounds of the default per-rating L2 penalty on factors and biases (see `default_l2`).
MIN_L2, MAX_L2 = 0.002, 0.1
#: Standard deviation of the initial factors.  MLLess used 0.1.
INIT_STD = 0.1


def default_l2(n_users: int, n_items: int, n_ratings: int | None) -> float:
    """The per-rating L2 penalty when the job sets none: 1 / (ratings per row), within [MIN_L2, MAX_L2].

    The penalty is applied once per rating, so a row with n ratings is pulled
    n times per epoch: λ = 1/n̄ makes that about one unit-variance prior per
    row, whatever the density.  A single constant cannot serve both ends: 0.1
    (LIBMF's CLI default) stops the MovieLens sample (8 ratings per row) from
    overfitting but costs 0.03 RMSE on 10M synthetic ratings (112 per row),
    where 0.01 is best.
    Without a rating count (an old model file) it is MAX_L2.
    """
    if not n_ratings:
        return MAX_L2
    return float(min(MAX_L2, max(MIN_L2, (n_users + n_items) / n_ratings)))


@register
class PMF(Model):
    """Biased matrix factorisation over a `RatingsBatch`; loss metric RMSE."""

    type = model_type("pmf")
    shape_dims = ("n_users", "n_items")

    @classmethod
    def from_dims(cls, dims: Mapping[str, Any], config: ModelConfig | None, seed: int) -> PMF:
        """Needs ``n_users``, ``n_items``, ``mean_rating``; optional ``rating_min``/``rating_max`` clip
        predictions, and ``n_ratings`` sets the default L2."""
        return cls(int(required_dim(dims, "n_users", cls.kind)), int(required_dim(dims, "n_items", cls.kind)),
                   float(required_dim(dims, "mean_rating", cls.kind)), config, seed,
                   rating_min=dims.get("rating_min"), rating_max=dims.get("rating_max"), n_ratings=dims.get("n_ratings"))

    def __init__(self, n_users: int, n_items: int, mean_rating: float, config: ModelConfig | None = None,
                 seed: int = 0, rating_min: float | None = None, rating_max: float | None = None,
                 n_ratings: int | None = None) -> None:
        config = config or ModelConfig("pmf")
        if n_users < 1 or n_items < 1:
            raise ValueError(f"PMF needs at least one user and one item, got {n_users} x {n_items}")
        if not math.isfinite(mean_rating):
            raise ValueError("mean_rating must be finite")
        self.n_users, self.n_items = int(n_users), int(n_items)
        self.rank = int(config.options["rank"])
        self.l2 = default_l2(n_users, n_items, n_ratings) if config.l2 is None else float(config.l2)
        self.mean = float(mean_rating)
        self.rating_min = None if rating_min is None else float(rating_min)
        self.rating_max = None if rating_max is None else float(rating_max)
        width = self.rank + 1
        super().__init__((self.n_users + self.n_items) * width)
        table = self.params.reshape(self.n_users + self.n_items, width)
        users, items = table[: self.n_users], table[self.n_users:]
        self.U, self.bu = users[:, : self.rank], users[:, self.rank]
        self.M, self.bi = items[:, : self.rank], items[:, self.rank]
        # Same seed => identical replicas on every worker.
        rng = np.random.default_rng(seed)
        self.U[:] = rng.normal(0.0, INIT_STD, size=self.U.shape)
        self.M[:] = rng.normal(0.0, INIT_STD, size=self.M.shape)
        # workspace for the gradient kernel: global row -> local slot, -1 when unused
        self._slots = np.full(self.n_users + self.n_items, -1, dtype=np.int32)

    def gradient(self, batch: Batch) -> tuple[np.ndarray, np.ndarray, float, int]:
        b = expect_batch(batch, RatingsBatch, "PMF")
        idx, grad, sse = _k.pmf_gradient(self.params, contiguous(b.users, np.int32), contiguous(b.items, np.int32),
                                         contiguous(b.ratings, np.float32), self.n_users, self.n_items, self.rank,
                                         self.mean, self.l2, self._slots)
        return idx, grad, float(sse), len(b)

    def entries_of_users(self, users: np.ndarray) -> np.ndarray:
        """The entries of the rows of `users` (a boolean mask over the first user ids), as a uint8 mask over params."""
        entries = np.zeros(self.size, dtype=np.uint8)
        entries[: len(users) * (self.rank + 1)] = np.repeat(users.astype(np.uint8), self.rank + 1)
        return entries

    @property
    def accumulator_size(self) -> int:
        """LIBMF's row-wise AdaGrad: one accumulator for a row's factors and one for its bias."""
        return 2 * (self.n_users + self.n_items)

    def adagrad_step(self, batch: Batch, g2: np.ndarray, lr: float, weight_decay: float) -> tuple[np.ndarray, np.ndarray, float, int]:
        b = expect_batch(batch, RatingsBatch, "PMF")
        idx, delta, sse = _k.pmf_adagrad_step(self.params, g2, contiguous(b.users, np.int32), contiguous(b.items, np.int32),
                                              contiguous(b.ratings, np.float32), self.n_users, self.n_items, self.rank,
                                              self.mean, self.l2, lr, self._slots)
        return idx, delta, float(sse), len(b)

    def predict(self, batch: Batch) -> np.ndarray:
        """Ratings, clipped to [rating_min, rating_max] when the range is known."""
        b = expect_batch(batch, RatingsBatch, "PMF")
        pred = _k.pmf_predict(self.params, contiguous(b.users, np.int32), contiguous(b.items, np.int32), self.n_users,
                              self.n_items, self.rank, self.mean)
        if self.rating_min is not None or self.rating_max is not None:
            np.clip(pred, self.rating_min, self.rating_max, out=pred)
        return pred

    def evaluate(self, batch: Batch) -> tuple[float, int]:
        """Squared error of the (clipped) predictions; unseen ids fall back to μ + known bias."""
        b = expect_batch(batch, RatingsBatch, "PMF")
        err = self.predict(b).astype(np.float64) - b.ratings
        return float(err @ err), len(b)

    def dims(self) -> dict[str, Any]:
        d: dict[str, Any] = {"n_users": self.n_users, "n_items": self.n_items, "mean_rating": self.mean}
        if self.rating_min is not None:
            d["rating_min"] = self.rating_min
        if self.rating_max is not None:
            d["rating_max"] = self.rating_max
        return d

    def config(self) -> ModelConfig:
        return ModelConfig.of("pmf", self.l2, rank=self.rank)

    def metadata(self) -> dict[str, Any]:
        return {**super().metadata(), "mean": self.mean}
