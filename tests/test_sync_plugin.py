"""A sync strategy defined here, outside the package, registered, and trained with on both transports.

It is model averaging whose replicas add each other's round deltas (shared + Σ_k δ_k) instead of averaging each
entry over the replicas that changed it (sync/protocols/averaging.py): a protocol that changes only how a worker
combines what it gathers, as one class here. Worker processes start from the job's JSON, so they import this file
through MLLESS_PLUGINS, without the tests' folder on their path: the tests' helpers are imported where used.
"""
from __future__ import annotations

import pytest

from mlless.contract import ENV_PLUGINS, STOP_MAX_EPOCHS
from mlless.runtime.local import Services, train_local
from mlless.sync.base import STRATEGIES, WorkerHalf, register
from mlless.sync.protocols.averaging import Averaging


@register
class SummedAveraging(Averaging):
    """Rounds of local steps, whose deltas every replica adds as they are: the base `WorkerHalf` combines."""

    name = "summed-averaging"
    worker_half = WorkerHalf


pytestmark = pytest.mark.slow


def test_a_registered_strategy_is_a_protocol_name_the_manifest_may_give(movielens_dir):
    from test_training import job_for

    assert STRATEGIES.named("summed-averaging") is SummedAveraging
    job = job_for(movielens_dir, sync={"protocol": "summed-averaging", "localSteps": 4})
    assert (job.sync.protocol, job.sync.local_steps) == ("summed-averaging", 4)


@pytest.mark.parametrize("services", ["embedded", "redis+rabbitmq"])
def test_a_job_trains_with_a_strategy_defined_in_a_test(movielens_dir, tmp_path, redis_url, amqp_url, services,
                                                          monkeypatch):
    from test_training import QUIET, job_for

    monkeypatch.setenv(ENV_PLUGINS, __file__)
    svc = Services(redis_url, amqp_url) if services != "embedded" else Services()
    job = job_for(movielens_dir, workers=2, sync={"protocol": "summed-averaging", "localSteps": 4}, stop={"maxEpochs": 10, "patience": 0})
    summary = train_local(job, tmp_path, svc, QUIET)
    assert summary["stop_reason"] == STOP_MAX_EPOCHS and summary["dropped_workers"] == []
    assert summary["rejected_frames"] == 0 and summary["bytes_sent"] > 0
    assert summary["validation_loss"] <= 0.95
