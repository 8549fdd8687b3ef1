"""An exchange pattern defined here, outside the package, registered, and trained with on both transports.

Point-to-point mailboxes: a worker writes its update once into each peer's mailbox and reads only its own, so each
frame has one reader (all-to-all writes one frame that every peer reads). It is one `Exchange` subclass and its
`register`, nothing else. Worker processes start from the job's JSON, so they import this file through
MLLESS_PLUGINS, without the tests' folder on their path: the tests' helpers are imported where used.
"""
from __future__ import annotations

import numpy as np
import pytest

from mlless.contract import ENV_PLUGINS, STOP_MAX_EPOCHS
from mlless.protocol.messages import Close, Update
from mlless.sync.exchanges.base import EXCHANGES, Exchange, register


@register
class Mailboxes(Exchange):
    """Each worker's update of a step, once per peer, under `<its slot>>peer`; a worker reads what is addressed to
    it. The peers are the job's ranks 0 .. P - 1 (`parts`): a job whose workers change is not for this pattern."""

    name = "mailboxes"

    @property
    def frames_per_step(self) -> int:
        return max(1, self.parts - 1)

    def publish(self, step: int, indices: np.ndarray, values: np.ndarray) -> int:
        return sum(self.write(step, f"{self.key_of(self.rank, step)}>{peer}", indices, values)
                   for peer in range(self.parts) if peer != self.rank)

    def gather(self, close: Close) -> list[Update]:
        senders = [r for r in close.updates if r != self.rank]
        frames = self.fetch([f"{self.key_of(r, close.step)}>{self.rank}" for r in senders])
        return [u for r, frame in zip(senders, frames) if (u := self.checked(r, close.step, frame)) is not None]


pytestmark = pytest.mark.slow


def test_a_registered_pattern_is_an_exchange_the_manifest_may_give(movielens_dir):
    from test_training import job_for

    assert EXCHANGES.named("mailboxes") is Mailboxes
    job = job_for(movielens_dir, sync={"protocol": "bsp", "exchange": "mailboxes"})
    assert job.sync.exchange == "mailboxes"


@pytest.mark.parametrize("services", ["embedded", "redis+rabbitmq"])
def test_a_job_trains_with_a_pattern_defined_in_a_test(movielens_dir, tmp_path, redis_url, amqp_url, services,
                                                       monkeypatch):
    from mlless.runtime.local import Services, train_local
    from test_training import QUIET, job_for

    monkeypatch.setenv(ENV_PLUGINS, __file__)
    svc = Services(redis_url, amqp_url) if services != "embedded" else Services()
    job = job_for(movielens_dir, workers=3, sync={"protocol": "bsp", "exchange": "mailboxes"},
                  stop={"maxEpochs": 4})
    summary = train_local(job, tmp_path, svc, QUIET)
    assert summary["stop_reason"] == STOP_MAX_EPOCHS and summary["dropped_workers"] == []
    assert summary["rejected_frames"] == 0 and summary["bytes_sent"] > 0
    assert summary["validation_loss"] <= 0.95
