"""Consensus ADMM (spec.sync.protocol: admm, sync/protocols/admm.py): logistic regression trains on both transports
and every exchange pattern, the replicas agree at a round's end and conserve every update through a scale-in,
`rho` is what pulls the local steps, a killed supervisor is resumed, and the protocol is refused for PMF."""
from __future__ import annotations

import pytest

from mlless.contract import STOP_MAX_EPOCHS
from mlless.runtime.local import Services, train_local
from mlless.sync import sync_strategy
from mlless.spec import SpecError, SyncConfig, from_manifest
from mlless.spec.models import BUILT_IN

from test_averaging import base_rate_bce, resumed_after_a_kill
from test_scaling import assert_conserved
from test_training import QUIET, _supervise_with, manifest

pytestmark = pytest.mark.slow


def admm_job(dataset, **spec):
    return from_manifest(manifest(dataset, model={"type": "logistic-regression"},
                                  **{"sync": {"protocol": "admm", "localSteps": 4}, **spec}))


def test_admm_runs_averagings_rounds():
    admm = sync_strategy(SyncConfig(protocol="admm", local_steps=4))
    assert [admm.publishes(t) for t in range(1, 9)] == [False, False, False, True] * 2
    assert [admm.must_have_closed(t) for t in (3, 4, 5)] == [0, 4, 4] and admm.threshold == 0


@pytest.mark.parametrize("exchange", ["all-to-all", "allreduce", "scatter-reduce"])
@pytest.mark.parametrize("services", ["embedded", "redis+rabbitmq"])
def test_lr_trains_under_admm(synthetic_lr_dir, tmp_path, redis_url, amqp_url, services, exchange):
    if services != "embedded" and exchange != "all-to-all":
        pytest.skip("the patterns' transport primitives are the same on both transports (tests/test_exchange.py)")
    svc = Services(redis_url, amqp_url) if services != "embedded" else Services()
    job = admm_job(synthetic_lr_dir, sync={"protocol": "admm", "localSteps": 4, "exchange": exchange},
                   stop={"maxEpochs": 5, "patience": 0})
    summary = train_local(job, tmp_path, svc, QUIET)
    assert summary["stop_reason"] == STOP_MAX_EPOCHS and summary["rejected_frames"] == 0
    assert summary["validation_loss"] < base_rate_bce(synthetic_lr_dir) - 0.05


def test_rho_pulls_the_local_steps_to_the_consensus(synthetic_lr_dir, tmp_path, redis_url, amqp_url):
    # A penalty this large pins every local step to z − u: d = x − z + u stays about 0, and z hardly moves.
    learned = {}
    for rho in (1.0, 1e5):
        job = admm_job(synthetic_lr_dir, sync={"protocol": "admm", "localSteps": 4, "rho": rho}, stop={"maxEpochs": 2})
        learned[rho] = train_local(job, tmp_path / str(rho), Services(), QUIET)["validation_loss"]
    base = base_rate_bce(synthetic_lr_dir)
    assert learned[1.0] < base - 0.03 and learned[1e5] > base - 0.01


def test_admm_replicas_agree_at_a_rounds_end_and_conserve_every_update_through_a_scale_in(
        synthetic_lr_dir, tmp_path, redis_url, amqp_url, audit):
    # The scale-in takes effect at step 1, inside the first round of 8; the job ends at a round's end.
    job = admm_job(synthetic_lr_dir, sync={"protocol": "admm", "localSteps": 8}, stop={"maxSteps": 96})
    summary = _supervise_with(job, tmp_path, redis_url, amqp_url, lambda s, l: s.request_workers(2))
    assert summary["workers_final"] == 2 and summary["dropped_workers"] == []
    assert summary["audit"]["leavers"] == 1
    assert summary["replica_spread"] < 1e-4  # every replica is the consensus z after a round's close
    assert_conserved(summary)


def test_a_killed_supervisor_of_an_admm_job_is_resumed(synthetic_lr_dir, tmp_path, redis_url, amqp_url):
    summary = resumed_after_a_kill(synthetic_lr_dir, tmp_path, redis_url, amqp_url, 200,
                                   model={"type": "logistic-regression"}, sync={"protocol": "admm", "localSteps": 8})
    assert summary["validation_loss"] < base_rate_bce(synthetic_lr_dir) - 0.05


@pytest.mark.parametrize("rho", [0, 1e6])
def test_rho_is_bounded_by_the_schema(synthetic_lr_dir, rho):
    with pytest.raises(SpecError, match="spec.sync.rho"):
        admm_job(synthetic_lr_dir, sync={"protocol": "admm", "rho": rho})


def test_admm_is_refused_for_pmf(movielens_dir):
    with pytest.raises(SpecError) as refused:
        from_manifest(manifest(movielens_dir, sync={"protocol": "admm"}))
    [line] = str(refused.value).splitlines()[1:]
    convex = " or ".join(t.name for t in BUILT_IN if "convex" in t.traits)
    assert convex.startswith("logistic-regression") and "pmf" not in convex
    assert line.strip() == f"spec.sync.protocol: admm needs spec.model.type {convex}, not pmf"
