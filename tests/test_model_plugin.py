"""A model defined here, outside the package, registered, and trained with on both transports.

It is the baseline of user and item biases, μ + b_u + b_i, in numpy: a `ModelType` (what a manifest needs) and a
`Model` (the maths), nothing else. Worker processes start from the job's JSON, so they import this file through
MLLESS_PLUGINS, without the tests' folder on their path: the tests' helpers are imported where used.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pytest

from mlless.contract import ENV_PLUGINS, STOP_MAX_EPOCHS
from mlless.data.batches import Batch, RatingsBatch
from mlless.spec.config import ModelConfig
from mlless.spec.models import ModelType, OptimizerDefaults
from mlless.spec.nodes import boolean
from mlless.training.models import register
from mlless.training.models.base import Model, expect_batch, required_dim


@register
class Biases(Model):
    """μ + b_u + b_i: the users' biases, then the items'."""

    # `userBiases`, a field of its own: false leaves the users' biases at 0 (the items' baseline alone).
    type = ModelType("biases", "user and item biases", "ratings", "rmse", OptimizerDefaults("adam", 0.05),
                     protocol="bsp", fields={"userBiases": boolean("Learn a bias per user (biases).", default=True)})
    shape_dims = ("n_users", "n_items")

    @classmethod
    def from_dims(cls, dims: Mapping[str, Any], config: ModelConfig | None, seed: int) -> Biases:
        return cls(*(required_dim(dims, d, cls.kind) for d in ("n_users", "n_items", "mean_rating")),
                   user_biases=(config or ModelConfig("biases")).options["userBiases"])

    def __init__(self, n_users: int, n_items: int, mean: float, user_biases: bool = True) -> None:
        super().__init__(n_users + n_items)
        self.n_users, self.n_items, self.mean = int(n_users), int(n_items), float(mean)
        self.user_biases = user_biases

    def _rows(self, b: RatingsBatch) -> np.ndarray:
        return np.concatenate([b.users if self.user_biases else b.users[:0], self.n_users + b.items])

    def predict(self, batch: Batch) -> np.ndarray:
        b = expect_batch(batch, RatingsBatch, "biases")
        return self.mean + self.params[b.users] + self.params[self.n_users + b.items]

    def gradient(self, batch: Batch) -> tuple[np.ndarray, np.ndarray, float, int]:
        b = expect_batch(batch, RatingsBatch, "biases")
        residual = self.predict(b).astype(np.float64) - b.ratings
        rows = self._rows(b)
        idx, slot = np.unique(rows, return_inverse=True)
        grad = np.bincount(slot, np.tile(2 * residual / len(b), len(rows) // len(b)), len(idx))
        return idx.astype(np.int32), grad.astype(np.float32), float(residual @ residual), len(b)

    def evaluate(self, batch: Batch) -> tuple[float, int]:
        b = expect_batch(batch, RatingsBatch, "biases")
        residual = self.predict(b).astype(np.float64) - b.ratings
        return float(residual @ residual), len(b)

    def dims(self) -> dict[str, Any]:
        return {"n_users": self.n_users, "n_items": self.n_items, "mean_rating": self.mean}

    def config(self) -> ModelConfig:
        return ModelConfig.of("biases", userBiases=self.user_biases)


pytestmark = pytest.mark.slow


def test_a_registered_model_type_is_a_type_the_manifest_may_give_with_its_defaults(movielens_dir):
    from test_training import job_for

    job = job_for(movielens_dir, model={"type": "biases"})
    assert (job.model.type, job.sync.protocol, job.optimizer.type, job.optimizer.learning_rate) == (
        "biases", "bsp", "adam", 0.05)


def test_a_registered_model_without_per_sample_adagrad_says_which_optimizers_it_takes(movielens_dir):
    from mlless.data.dataset import Dataset

    model = Biases(3, 2, 3.5)
    with pytest.raises(ValueError, match="biases has no per-sample AdaGrad: set spec.optimizer.type"):
        model.adagrad_step(Dataset.open(str(movielens_dir)).batch(0), np.ones(5, np.float32), 0.1, 0.0)


@pytest.mark.parametrize("services", ["embedded", "redis+rabbitmq"])
def test_a_job_trains_a_model_defined_in_a_test(movielens_dir, tmp_path, redis_url, amqp_url, services, monkeypatch):
    from mlless.data.dataset import Dataset
    from mlless.runtime.local import Services, train_local
    from mlless.training.models import load_model
    from test_training import QUIET, job_for

    monkeypatch.setenv(ENV_PLUGINS, __file__)
    svc = Services(redis_url, amqp_url) if services != "embedded" else Services()
    job = job_for(movielens_dir, workers=2, model={"type": "biases"}, stop={"maxEpochs": 8, "patience": 0})
    summary = train_local(job, tmp_path, svc, QUIET)
    assert summary["stop_reason"] == STOP_MAX_EPOCHS and summary["dropped_workers"] == []
    assert summary["rejected_frames"] == 0 and summary["loss_metric"] == "rmse"
    # The biases learn: they beat predicting the training mean for every rating on the validation split.
    validation = Dataset.open(str(movielens_dir)).validation()
    mean_only = float(np.sqrt(np.mean((validation.ratings - Biases.from_dims(Dataset.open(str(movielens_dir)).dims(),
                                                                             None, 0).mean) ** 2)))
    assert summary["validation_loss"] < mean_only - 0.03, (summary["validation_loss"], mean_only)
    assert type(load_model(tmp_path / "model.npz")).__name__ == "Biases"  # the class the plugin's import registered


def test_a_field_the_registered_type_declares_reaches_every_worker_and_the_saved_model(movielens_dir, tmp_path,
                                                                                     monkeypatch):
    from mlless.runtime.local import Services, train_local
    from mlless.training.models import load_model
    from test_training import QUIET, job_for

    monkeypatch.setenv(ENV_PLUGINS, __file__)
    job = job_for(movielens_dir, workers=2, model={"type": "biases", "userBiases": False}, stop={"maxEpochs": 2})
    assert job.model.options == {"userBiases": False}
    summary = train_local(job, tmp_path, Services(), QUIET)
    assert summary["stop_reason"] == STOP_MAX_EPOCHS and summary["rejected_frames"] == 0
    model = load_model(tmp_path / "model.npz")
    assert model.user_biases is False and not np.any(model.params[:model.n_users])
    assert np.any(model.params[model.n_users:])  # the items' biases learned


def test_a_value_the_declared_field_refuses_is_one_line_naming_it(movielens_dir, monkeypatch):
    from mlless.spec import SpecError
    from test_training import job_for

    with pytest.raises(SpecError, match="spec.model.userBiases: 'no' is not of type 'boolean'"):
        job_for(movielens_dir, model={"type": "biases", "userBiases": "no"})
