"""Blocked matrix factorisation (spec.sync.protocol: blocked, runtime/sync/blocked.py): the strata of a round share
no user and no item, P rounds pass over every rating, PMF trains on both transports, every update is applied exactly
once through a scale-in mid-round and by the auto-tuner, a killed supervisor is resumed, and the protocol is refused
for a model without users and items."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from mlless.data.dataset import Dataset
from mlless.runtime.local import Services, train_local
from mlless.runtime.sync import sync_strategy
from mlless.runtime.sync.blocked import BlockedFeed, balanced_blocks
from mlless.spec import SpecError, SyncConfig, from_manifest
from mlless.spec.crd import crd_manifest

from faults.test_failover import finish, kill_at, summary_of, train
from test_scaling import assert_conserved
from test_training import QUIET, _supervise_with, job_for, manifest, read_metrics


@pytest.mark.parametrize("workers", [2, 3])
def test_the_strata_partition_the_ratings_evenly_and_a_rounds_share_no_row(movielens_dir, workers):
    dataset = Dataset.open(str(movielens_dir), cache_batches=True)
    live = tuple(range(workers))
    feeds = [BlockedFeed(dataset, seed=7, local_steps=16) for _ in live]
    for round_ in range(workers):
        for local in range(1, 17):
            batches = [feed.take(0, round_ * 16 + local, live, rank) for rank, feed in zip(live, feeds)]
            for a in range(workers):
                for b in range(a + 1, workers):
                    assert not set(batches[a].users) & set(batches[b].users)
                    assert not set(batches[a].items) & set(batches[b].items)
    strata = [stratum for feed in feeds for stratum in feed.strata]
    every = sorted((int(u), int(i)) for batch in dataset for u, i in zip(batch.users, batch.items))
    assert sorted((int(u), int(i)) for s in strata for u, i in zip(s.users, s.items)) == every
    mean = len(every) / workers**2  # MovieLens is skewed: split by id alone, the strata differ by more
    assert all(abs(len(s) - mean) < 0.05 * mean for s in strata)


def test_a_step_trains_one_batchs_worth_so_the_cursor_counts_epochs(movielens_dir):
    dataset = Dataset.open(str(movielens_dir))
    feed = BlockedFeed(dataset, seed=0, local_steps=16)
    sizes = [len(feed.take(0, step, (4, 9), 9)) for step in range(1, 17)]
    assert max(sizes) == round(dataset.manifest.n_train / dataset.n_batches)
    assert feed.layout == (2, 1)  # the worker at index 1 of the live set owns user block 1
    users = np.concatenate([dataset.batch(i).users for i in range(dataset.n_batches)])
    assert set(balanced_blocks(users, 2)[feed.take(0, 1, (4, 9), 9).users]) == {1}


def test_blocked_rounds_are_averagings():
    blocked = sync_strategy(SyncConfig(protocol="blocked", local_steps=4))
    assert [blocked.publishes(t) for t in range(1, 9)] == [False, False, False, True] * 2
    assert [blocked.must_have_closed(t) for t in (3, 4, 5)] == [0, 4, 4] and blocked.threshold == 0


def test_blocked_is_refused_for_a_model_without_users_and_items(synthetic_lr_dir, tmp_path):
    with pytest.raises(SpecError) as refused:
        from_manifest(manifest(synthetic_lr_dir, model={"type": "logistic-regression"}, sync={"protocol": "blocked"}))
    [line] = str(refused.value).splitlines()[1:]
    assert line.strip() == "spec.sync.protocol: blocked needs spec.model.type pmf, not logistic-regression"
    [rule] = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"]
    assert "self.sync.protocol != 'blocked'" in rule["rule"] and "['pmf']" in rule["rule"]


@pytest.mark.slow
@pytest.mark.parametrize("services", ["embedded", "redis+rabbitmq"])
def test_pmf_trains_under_blocked(movielens_dir, tmp_path, redis_url, amqp_url, services):
    svc = Services(redis_url, amqp_url) if services != "embedded" else Services()
    job = job_for(movielens_dir, sync={"protocol": "blocked"}, stop={"maxEpochs": 15})
    summary = train_local(job, tmp_path, svc, QUIET)
    assert summary["stop_reason"] == "max epochs" and summary["rejected_frames"] == 0
    assert summary["validation_loss"] <= 0.92
    rows = read_metrics(tmp_path)
    assert len(rows) == summary["steps"] and rows[-1]["epoch"] == pytest.approx(15, abs=0.1)


@pytest.fixture
def audit(monkeypatch):
    monkeypatch.setenv("MLLESS_AUDIT", "1")


@pytest.mark.slow
def test_every_update_is_applied_exactly_once_through_a_scale_in_mid_round(movielens_dir, tmp_path, redis_url,
                                                                          amqp_url, audit):
    def scale_in(supervisor, launcher):
        # Asked before the first close (a round's reports reach the supervisor at its end), the scale-in takes
        # effect at step 1, inside the first round of 32: the leaver's unsent steps go to the survivors.
        supervisor.request_workers(2)

    job = job_for(movielens_dir, sync={"protocol": "blocked", "localSteps": 32}, stop={"maxSteps": 96})
    summary = _supervise_with(job, tmp_path, redis_url, amqp_url, scale_in)
    assert summary["workers_final"] == 2 and summary["dropped_workers"] == []
    assert summary["audit"]["leavers"] == 1 and summary["audit"]["leaver_pending_entries"] > 0
    assert summary["replica_spread"] < 1e-4  # step 96 ends a round: the replicas are equal again
    assert_conserved(summary)


@pytest.mark.slow
def test_auto_tuner_scales_in_under_blocked(movielens_dir, tmp_path, redis_url, amqp_url, audit):
    autoscaler = {"enabled": True, "intervalSeconds": 0.5, "horizonSeconds": 0.5, "minWorkers": 2}
    # Rounds of 8 steps: the tuner's scale-in takes effect at a round's end, and the job must have a few.
    job = job_for(movielens_dir, workers=4, autoscaler=autoscaler, sync={"protocol": "blocked", "localSteps": 8},
                  stop={"maxEpochs": 10})
    summary = _supervise_with(job, tmp_path, redis_url, amqp_url, lambda s, l: None)
    leaves = [e for e in summary["scaling_events"] if e["event"] == "leave"]
    assert leaves and all(e["reason"].startswith("auto-tuner") for e in leaves)
    assert summary["workers_final"] == 4 - len(leaves) >= 2 and summary["dropped_workers"] == []
    assert_conserved(summary)
    assert summary["validation_loss"] < 0.92


@pytest.mark.slow
def test_a_killed_supervisor_of_a_blocked_job_is_resumed(movielens_dir, tmp_path, redis_url, amqp_url):
    doc = manifest(movielens_dir, workers=2, sync={"protocol": "blocked", "localSteps": 8},
                   stop={"maxSteps": 300}, evaluation={"everySteps": 10})
    job, run_dir = tmp_path / "job.yaml", tmp_path / "run"
    job.write_text(yaml.safe_dump(doc))
    services = ("--redis-url", redis_url, "--amqp-url", amqp_url)
    kill_at(train(job, run_dir, *services), run_dir, 100)  # mid-round: 100 is no multiple of 8
    finish(train(job, run_dir, "--resume", *services))
    summary = summary_of(run_dir)
    assert summary["stop_reason"] == "max steps" and summary["steps"] == 300
    assert summary["validation_loss"] < 0.95
