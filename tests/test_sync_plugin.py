"""A sync strategy defined here, outside the package, registered, and trained with on both transports.

It is model averaging with LambdaML's combination, the mean of the replicas (shared + mean_k δ_k), where the
package's `averaging` adds the round deltas (shared + Σ_k δ_k, runtime/sync/averaging.py says why): a new
protocol that changes only how a worker combines what it gathers, as one class here. Worker processes start from
the job's JSON, so they import this file through MLLESS_SYNC_PLUGINS; it therefore imports nothing of the tests.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mlless.contract import ENV_SYNC_PLUGINS
from mlless.progress import Progress
from mlless.protocol.messages import Close, Update
from mlless.runtime.local import Services, train_local
from mlless.runtime.sync import STRATEGIES, register
from mlless.runtime.sync.averaging import Averaging
from mlless.runtime.sync.base import WorkerHalf
from mlless.spec import from_manifest


class MeanHalf(WorkerHalf):
    """Each replica becomes the mean of the round's replicas: peers' deltas / n, and its own δ times −(1 − 1/n)."""

    def combine(self, close: Close, updates: list[Update]) -> None:
        own = [p for p in self.exchange.outbox if p.step == close.step]
        n = len(updates) + len(own)
        if n < 2:
            return
        super().combine(close, [Update(u.sender, u.step, u.indices, u.values / n) for u in updates])
        for published in own:
            self.replica.apply(published.indices, -(1 - 1 / n) * published.values)


@register
class MeanAveraging(Averaging):
    name = "mean-averaging"
    worker_half = MeanHalf


pytestmark = pytest.mark.slow


def manifest(dataset: Path, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "mlless.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "plugin"},
        "spec": {"workers": 2, "model": {"type": "pmf"}, "dataset": {"uri": str(dataset), "cacheBatches": True}, **spec},
    }


def test_a_registered_strategy_is_a_protocol_name_the_manifest_may_give(movielens_dir):
    assert STRATEGIES["mean-averaging"] is MeanAveraging
    job = from_manifest(manifest(movielens_dir, sync={"protocol": "mean-averaging", "localSteps": 4}))
    assert (job.sync.protocol, job.sync.local_steps) == ("mean-averaging", 4)


@pytest.mark.parametrize("services", ["embedded", "redis+rabbitmq"])
def test_a_job_trains_with_a_strategy_defined_in_a_test(movielens_dir, tmp_path, redis_url, amqp_url, services,
                                                          monkeypatch):
    monkeypatch.setenv(ENV_SYNC_PLUGINS, __file__)
    svc = Services(redis_url, amqp_url) if services != "embedded" else Services()
    job = from_manifest(manifest(movielens_dir, sync={"protocol": "mean-averaging", "localSteps": 4},
                                 stop={"maxEpochs": 10}))
    summary = train_local(job, tmp_path, svc, Progress(enabled=False))
    assert summary["stop_reason"] == "max epochs" and summary["dropped_workers"] == []
    assert summary["rejected_frames"] == 0 and summary["bytes_sent"] > 0
    assert summary["validation_loss"] <= 0.95
