"""Model averaging (spec.sync.protocol: averaging, and async without its barrier): trains PMF and LR on both
transports, and a network; under them and blocked,
every replica stays the shared state plus its own unsent updates (the MLLESS_AUDIT conservation check) through
scale-in by a request and by the auto-tuner, and a killed supervisor is resumed."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from mlless.contract import STOP_MAX_EPOCHS, STOP_MAX_STEPS
from mlless.data.dataset import Dataset
from mlless.runtime.local import Services, train_local
from mlless.sync import sync_strategy
from mlless.spec import SpecError, SyncConfig, from_manifest

from faults.test_failover import finish, kill_at, summary_of, train
from test_gradients import digits_job
from test_scaling import assert_conserved
from test_training import QUIET, _supervise_with, job_for, manifest, read_metrics

pytestmark = pytest.mark.slow


def test_averaging_publishes_at_rounds_ends_and_waits_only_there():
    averaging = sync_strategy(SyncConfig(protocol="averaging", local_steps=4))
    assert [averaging.publishes(t) for t in range(1, 9)] == [False, False, False, True] * 2
    # Inside round 2 (steps 5..8) a worker awaits round 1's close; at its last step, round 2's.
    assert [averaging.must_have_closed(t) for t in (0, 3, 4, 5, 7, 8)] == [0, 0, 4, 4, 4, 8]
    assert averaging.threshold == 0 and averaging.update_key(1, 4) != averaging.update_key(1, 8)


@pytest.mark.parametrize("h", [0, 10001])
def test_local_steps_are_bounded_by_the_schema(movielens_dir, h):
    with pytest.raises(SpecError, match="spec.sync.localSteps"):
        job_for(movielens_dir, sync={"protocol": "averaging", "localSteps": h})


def base_rate_bce(dataset_dir) -> float:
    p = Dataset.open(str(dataset_dir)).validation().labels.mean()
    return float(-(p * np.log(p) + (1 - p) * np.log(1 - p)))


def test_async_waits_only_a_round_behind():
    asynchronous = sync_strategy(SyncConfig(protocol="async", local_steps=4))
    assert [asynchronous.publishes(t) for t in range(1, 9)] == [False, False, False, True] * 2
    # Round 2 (steps 5..8) and round 3's first step need nothing closed; round 3's last step needs round 1's close.
    assert [asynchronous.must_have_closed(t) for t in (3, 4, 5, 8, 9, 12, 13)] == [0, 0, 0, 4, 4, 8, 8]
    # A round's frame is read up to a round later: two rounds' slots are in use, and never the same one.
    assert len({asynchronous.update_key(1, t) for t in (4, 8)}) == 2


@pytest.mark.parametrize("protocol", ["averaging", "async"])
@pytest.mark.parametrize("services", ["embedded", "redis+rabbitmq"])
def test_pmf_and_lr_train_under_averaging(movielens_dir, synthetic_lr_dir, tmp_path, redis_url, amqp_url, services,
                                          protocol):
    svc = Services(redis_url, amqp_url) if services != "embedded" else Services()
    pmf = job_for(movielens_dir, sync={"protocol": protocol}, stop={"maxEpochs": 15, "patience": 0})
    summary = train_local(pmf, tmp_path / "pmf", svc, QUIET)
    assert summary["stop_reason"] == STOP_MAX_EPOCHS and summary["rejected_frames"] == 0
    assert summary["validation_loss"] <= 0.92
    rows = read_metrics(tmp_path / "pmf")
    assert len(rows) == summary["steps"] and any(r["validation_loss"] is not None for r in rows)
    lr = from_manifest(manifest(synthetic_lr_dir, model={"type": "logistic-regression"},
                                sync={"protocol": protocol, "localSteps": 4}, stop={"maxEpochs": 5}))
    summary = train_local(lr, tmp_path / "lr", svc, QUIET)
    assert summary["validation_loss"] < base_rate_bce(synthetic_lr_dir) - 0.05


@pytest.mark.parametrize("protocol", ["averaging", "async"])
def test_a_network_trains_under_averaging(digits_dir, tmp_path, audit, protocol):
    """A tiny network on the digits at P = 2, rounds of 4 steps, each worker with its own Adam at 0.01: 80 steps
    reach 0.94 and 0.955 validation accuracy under averaging (seeds 0 and 1), 0.955 under async (seed 0); chance is
    0.1."""
    pytest.importorskip("torch")
    job = digits_job(digits_dir, workers=2, sync={"protocol": protocol, "localSteps": 4}, stop={"maxSteps": 80},
                     optimizer={"type": "adam", "learningRate": 0.01}, evaluation={"everySteps": 20})
    summary = train_local(job, tmp_path, Services(), QUIET)
    assert summary["steps"] == 80 and summary["rejected_frames"] == 0
    assert summary["validation_scores"]["accuracy"] >= 0.88
    assert_conserved(summary)
    # Step 80 ends a round: averaging's replicas are its mean, equal again; async's differ by a round they did not
    # wait for.
    assert (summary["replica_spread"] < 1e-4) == (protocol == "averaging")


#: The protocols that publish once per round (blocked: tests/test_blocked.py has its own data placement tests).
ROUNDS = ["averaging", "blocked", "async"]


@pytest.mark.parametrize("protocol", ROUNDS)
def test_every_update_is_applied_exactly_once_through_a_scale_in_mid_round(movielens_dir, tmp_path, redis_url,
                                                                          amqp_url, audit, protocol):
    def scale_in(supervisor, launcher):
        # Asked before the first close (a round's reports reach the supervisor at its end), the scale-in takes
        # effect at step 1, inside the first round of 32: the leaver's unsent steps go to the survivors (under
        # blocked the blocks change at the next round).
        supervisor.request_workers(2)

    job = job_for(movielens_dir, sync={"protocol": protocol, "localSteps": 32}, stop={"maxSteps": 96})
    summary = _supervise_with(job, tmp_path, redis_url, amqp_url, scale_in)
    assert summary["workers_final"] == 2 and summary["dropped_workers"] == []
    assert summary["audit"]["leavers"] == 1 and summary["audit"]["leaver_pending_entries"] > 0
    # Step 96 ends a round: averaging's replicas are equal again, as under BSP; blocked's differ by their home rows.
    assert (summary["replica_spread"] < 1e-4) == (protocol == "averaging")
    assert_conserved(summary)


@pytest.mark.parametrize("protocol", ROUNDS)
def test_a_worker_taken_out_in_the_last_round_still_hands_on_its_updates(movielens_dir, tmp_path, redis_url,
                                                                         amqp_url, audit, protocol):
    # Taken out at step 1, the leaver reads that close only at the round's end (step 32), after the job stopped
    # at step 8: the supervisor waits for its replica, or its unsent updates are lost (the audit's error).
    job = job_for(movielens_dir, sync={"protocol": protocol, "localSteps": 32}, stop={"maxSteps": 8})
    summary = _supervise_with(job, tmp_path, redis_url, amqp_url, lambda s, l: s.request_workers(2))
    assert summary["dropped_workers"] == [] and summary["steps"] == 8
    assert summary["audit"]["replicas"] == 3  # the leaver's replica is as final as the survivors'
    assert_conserved(summary)


@pytest.mark.parametrize("protocol", ROUNDS)
def test_auto_tuner_scales_in_under_rounds(movielens_dir, tmp_path, redis_url, amqp_url, audit, protocol):
    autoscaler = {"enabled": True, "intervalSeconds": 0.5, "horizonSeconds": 0.5, "minWorkers": 2}
    # Rounds of 8 steps: the tuner's scale-in takes effect at a round's end, and the job must have a few.
    job = job_for(movielens_dir, workers=4, autoscaler=autoscaler, sync={"protocol": protocol, "localSteps": 8},
                  stop={"maxEpochs": 10})
    summary = _supervise_with(job, tmp_path, redis_url, amqp_url, lambda s, l: None)
    leaves = [e for e in summary["scaling_events"] if e["event"] == "leave"]
    assert leaves and all(e["reason"].startswith("auto-tuner") for e in leaves)
    # A leave takes effect at a round's end: one asked for in the job's last round (a loaded machine shifts the
    # tuner's timing) leaves a final replica behind, but not a worker.
    assert summary["workers_final"] == 4 - len(leaves) >= 2 and summary["dropped_workers"] == []
    assert_conserved(summary)
    assert summary["validation_loss"] < 0.92


def resumed_after_a_kill(dataset, tmp_path, redis_url, amqp_url, steps, **spec):
    """A two-worker job over Redis + RabbitMQ with rounds of 8, its supervisor killed mid-round and resumed: the
    summary, once the survivors' replicas took the job on."""
    doc = manifest(dataset, workers=2, stop={"maxSteps": steps, "patience": 0}, evaluation={"everySteps": 10}, **spec)
    job, run_dir = tmp_path / "job.yaml", tmp_path / "run"
    job.write_text(yaml.safe_dump(doc))
    services = ("--redis-url", redis_url, "--amqp-url", amqp_url)
    kill_at(train(job, run_dir, *services), run_dir, steps // 3 // 8 * 8 + 4)  # mid-round
    finish(train(job, run_dir, "--resume", *services))
    summary = summary_of(run_dir)
    assert summary["stop_reason"] == STOP_MAX_STEPS and summary["steps"] == steps
    [takeover] = summary["takeovers"]
    assert takeover["from"] == "replicas of 2 surviving workers"
    return summary


@pytest.mark.parametrize("protocol", ROUNDS)
def test_a_killed_supervisor_of_a_job_with_rounds_is_resumed(movielens_dir, tmp_path, redis_url, amqp_url, protocol):
    summary = resumed_after_a_kill(movielens_dir, tmp_path, redis_url, amqp_url, 300,
                                   sync={"protocol": protocol, "localSteps": 8})
    assert summary["validation_loss"] < 0.95


def test_each_steps_staleness_is_measured(synthetic_lr_dir, tmp_path):
    """A report says how many earlier steps' closes the replica lacked: none under BSP; at a round's last step
    under averaging the H − 1 before it in the round; under async, at a round's last step, at least the H steps
    since the last close it waited for (the previous round's, which it need not have), at most 2H − 1."""
    staleness = {}
    for protocol in ("bsp", "averaging", "async"):
        job = from_manifest(manifest(synthetic_lr_dir, workers=2, model={"type": "logistic-regression"},
                                     sync={"protocol": protocol, "localSteps": 4}, stop={"maxSteps": 48}))
        summary = train_local(job, tmp_path / protocol, Services(), QUIET)
        rows = read_metrics(tmp_path / protocol)
        assert summary["max_staleness"] == max(r["staleness"] for r in rows)
        staleness[protocol] = [r["staleness"] for r in rows]
    assert set(staleness["bsp"]) == {0}
    assert max(staleness["averaging"]) == 3 and staleness["averaging"][3::4] == [3] * 12
    assert 4 <= max(staleness["async"]) <= 7
