"""Service outages during a job.

A RabbitMQ forced close or restart is waited out with nothing lost; a service lost for good ends the job with
its best model. Each job runs as `mlless train` (a supervisor process and real worker processes) over this
module's own RabbitMQ node or a Redis of the test's own; the shared services are used, never stopped.
The fault is injected once the job is training.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from typing import Callable
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
import redis
import yaml

import worker_env
from mlless.contract import ENV_PLUGINS, STOP_MAX_STEPS, STOP_NO_LIVE_WORKERS, STOP_SERVICE_LOST
from mlless.data.dataset import Dataset
from mlless.protocol.framing import decode, encode
from mlless.protocol.messages import Update
from mlless.runtime.local import new_job_id
from mlless.sync.exchanges.base import Published
from mlless.runtime.worker import Worker
from mlless.transport import connect
from test_training import job_for

from faults.conftest import redis_server

pytestmark = [pytest.mark.slow, pytest.mark.services]

STEPS = 240


def start_job(dataset: Path, run_dir: Path, redis_url: str, amqp_url: str, steps: int = STEPS,
              env: dict[str, str] | None = None, stderr: Path | None = None, **spec: object) -> subprocess.Popen:
    """`mlless train` of a PMF job; its stderr (the supervisor's log) piped, or written to `stderr` for a test that
    reads it while the job runs. Its workers record their environments (`worker_env`)."""
    manifest = {"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "fault"},
                "spec": {"workers": 2, "model": {"type": "pmf"}, "sync": {"protocol": "bsp"},
                         "dataset": {"uri": str(dataset), "cacheBatches": True}, "stop": {"maxSteps": steps, "patience": 0},
                         "evaluation": {"everySteps": 10}, **spec}}
    job = run_dir.parent / f"{run_dir.name}.yaml"
    job.write_text(yaml.safe_dump(manifest))
    with open(stderr, "w") if stderr else contextlib.nullcontext(subprocess.PIPE) as err:
        return subprocess.Popen([sys.executable, "-m", "mlless", "train", str(job), "--out", str(run_dir), "-q",
                                 "--redis-url", redis_url, "--amqp-url", amqp_url],
                                stdout=subprocess.PIPE, stderr=err, text=True,
                                env={**os.environ, ENV_PLUGINS: worker_env.__file__, **(env or {})})


def wait_for_steps(run_dir: Path, proc: subprocess.Popen, steps: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= steps):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"fewer than {steps} steps in {timeout:g}s"
        time.sleep(0.1)


def finish(proc: subprocess.Popen, run_dir: Path) -> tuple[dict, str]:
    """The summary of a job that succeeded, and its stderr."""
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads((run_dir / "summary.json").read_text()), err


def assert_nothing_lost(finished: tuple[dict, str], rabbit) -> None:
    """The job of `finish` ran to its end with every worker and every frame; a failure shows its warnings."""
    summary, err = finished
    said = "\n".join(line for line in err.splitlines() if "WARNING" in line or "ERROR" in line)[-4000:]
    assert summary["stop_reason"] == STOP_MAX_STEPS, said
    assert summary["steps"] == STEPS
    assert summary["workers_final"] == 2 and summary["dropped_workers"] == [], (summary["dropped_workers"], said)
    assert summary["rejected_frames"] == 0, said
    assert summary["replica_spread"] < 1e-4  # BSP: the replicas agree, as in an undisturbed run (test_training.py)
    assert rabbit.queues() == []


def test_a_forced_close_of_every_connection_is_a_reconnect(rabbit, movielens_dir, tmp_path, redis_url):
    """`rabbitmqctl close_all_connections`: every client gets 320 CONNECTION_FORCED mid-job."""
    run_dir = tmp_path / "run"
    proc = start_job(movielens_dir, run_dir, redis_url, rabbit.url)
    wait_for_steps(run_dir, proc, 30)
    rabbit.ctl("close_all_connections", "fault test")
    assert_nothing_lost(finish(proc, run_dir), rabbit)


def test_a_broker_restart_loses_its_queues_and_the_job_goes_on(rabbit, movielens_dir, tmp_path, redis_url):
    """`stop_app` / `start_app`: the queues are not durable, so what they held is gone; each side re-sends."""
    run_dir = tmp_path / "run"
    proc = start_job(movielens_dir, run_dir, redis_url, rabbit.url)
    wait_for_steps(run_dir, proc, 30)
    rabbit.ctl("stop_app")
    time.sleep(3)
    rabbit.ctl("start_app")
    assert_nothing_lost(finish(proc, run_dir), rabbit)


def test_a_redis_restarted_without_persistence_loses_no_update(private_redis, rabbit, movielens_dir, tmp_path):
    """Redis shut down mid-job and started again empty: the update frames it held are published again by their
    senders, so every replica applies every update (BSP: they agree as in an undisturbed run), and the summary
    says what was repaired. The rank registry went with it too, yet no queue is left behind."""
    run_dir = tmp_path / "run"
    proc = start_job(movielens_dir, run_dir, private_redis, rabbit.url)
    wait_for_steps(run_dir, proc, 30)
    subprocess.run(["redis-cli", "-u", private_redis, "shutdown", "nosave"], capture_output=True, timeout=30)
    time.sleep(2)
    with redis_server(port=urlsplit(private_redis).port):
        assert_nothing_lost(finish(proc, run_dir), rabbit)
        assert redis.Redis.from_url(private_redis).keys("*") == []
    # Each worker noticed and published its frames again; whether a peer had still to read one depends on where
    # in its step the restart fell (summary["repaired_frames"] counts those), so the next test pins that down.
    for rank in (0, 1):
        assert "the store lost the job's keys; re-published" in (run_dir / "logs" / f"worker-{rank}.log").read_text()


def test_workers_waiting_out_a_redis_outage_longer_than_the_worker_timeout_are_not_dropped(
        private_redis, rabbit, movielens_dir, tmp_path):
    """Issue #22: with Redis gone for longer than workerTimeoutSeconds, the workers, blocked on it, stop reporting;
    the supervisor used to drop them all and end with "no live workers". It now waits the outage out with them."""
    run_dir = tmp_path / "run"
    proc = start_job(movielens_dir, run_dir, private_redis, rabbit.url, liveness={"workerTimeoutSeconds": 2})
    wait_for_steps(run_dir, proc, 30)
    subprocess.run(["redis-cli", "-u", private_redis, "shutdown", "nosave"], capture_output=True, timeout=30)
    time.sleep(6)  # three worker timeouts
    with redis_server(port=urlsplit(private_redis).port):
        assert_nothing_lost(finish(proc, run_dir), rabbit)


def test_a_frame_the_store_lost_is_published_again_and_read(private_redis, amqp_url, movielens_dir):
    """The repair itself, with this test's own Redis flushed, as a restart without persistence would leave it."""
    assert_a_lost_frame_is_published_again(private_redis, amqp_url, movielens_dir, 0,
                                           lambda job_id: redis.Redis.from_url(private_redis).flushall())


def assert_a_lost_frame_is_published_again(redis_url: str, amqp_url: str, dataset: Path, sender_rank: int,
                                           lose: Callable[[str], None],
                                           check: Callable[[str, str], None] = lambda job_id, key: None) -> None:
    """Step by step: worker `sender_rank` publishes an update, `lose(job_id)` makes the store lose it, the other
    worker finds it missing and waits; the sender, waiting for a step-close meanwhile, notices the loss within a
    second and publishes it again; the reader reads it. Then `check(job_id, key)`, before the keys are deleted."""
    job = job_for(dataset, workers=2)
    job_id = new_job_id("repair")
    transports = [connect(job_id, redis_url=redis_url, amqp_url=amqp_url, role="worker", rank=r) for r in (0, 1)]
    data = Dataset.open(job.dataset_uri)
    workers = [Worker(job, r, t, data) for r, t in enumerate(transports)]
    sender, reader = workers[sender_rank], workers[1 - sender_rank]
    try:
        indices, values = np.array([3], np.int32), np.array([0.5], np.float32)
        frame = encode(Update(sender=sender_rank, step=1, indices=indices, values=values))
        key = sender.sync.update_key(sender_rank, 1)
        sender.transport.put(key, frame)
        sender.half.exchange.outbox.append(Published(1, key, frame, indices, values))
        lose(job_id)
        waiting = threading.Thread(target=sender._await_close, args=(0,), daemon=True)  # no close comes: it probes
        waiting.start()
        [got] = reader.half.exchange.fetch([key])
        assert got is not None and decode(got) == decode(frame)
        assert reader.repaired_frames == 1 and reader.transport.store_epoch == 1
        sender.leave_requested = True  # ends its wait at the next empty poll
        waiting.join(timeout=5)
        assert not waiting.is_alive()
        assert sender.transport.store_epoch == 1  # noticed once, though it looked more than once
        check(job_id, key)
    finally:
        for t in transports:
            t.delete_job()
            t.close()


def assert_failed_cleanly_with_the_best_snapshot(proc: subprocess.Popen, run_dir: Path, reason: str) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]  # EXIT_FAILED
    assert "Traceback" not in err, err[-3000:]
    assert (run_dir / "summary.json").exists(), err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"].startswith(reason), summary["stop_reason"]
    assert summary["validation_loss"] is not None and summary["model_step"] >= 10  # an evaluated snapshot
    assert (run_dir / "model.npz").exists()
    return summary


def test_a_broker_that_stays_down_ends_the_job_with_its_best_model(rabbit, movielens_dir, tmp_path, redis_url):
    run_dir = tmp_path / "run"
    proc = start_job(movielens_dir, run_dir, redis_url, rabbit.url, steps=100_000, env={"MLLESS_OUTAGE_SECONDS": "3"})
    wait_for_steps(run_dir, proc, 30)
    rabbit.ctl("stop_app")
    try:
        assert_failed_cleanly_with_the_best_snapshot(proc, run_dir, STOP_SERVICE_LOST)
    finally:
        rabbit.ctl("start_app")
        rabbit.wait_until_up()


def test_a_redis_lost_for_good_ends_the_job_with_its_best_model(private_redis, movielens_dir, tmp_path, amqp_url):
    """Redis without persistence, shut down mid-job and not restarted: the workers fail, the supervisor saves."""
    run_dir = tmp_path / "run"
    proc = start_job(movielens_dir, run_dir, private_redis, amqp_url, steps=100_000, env={"MLLESS_OUTAGE_SECONDS": "3"})
    wait_for_steps(run_dir, proc, 30)
    subprocess.run(["redis-cli", "-u", private_redis, "shutdown", "nosave"], capture_output=True, timeout=30)
    summary = assert_failed_cleanly_with_the_best_snapshot(proc, run_dir, "")
    assert summary["stop_reason"] in (STOP_NO_LIVE_WORKERS,) or summary["stop_reason"].startswith(STOP_SERVICE_LOST)


def test_a_redis_busy_running_a_script_is_waited_out(private_redis, amqp_url):
    """A script past Redis's busy-reply-threshold makes it answer every other client BUSY until it ends (in-store's
    merge of a large step can): a call waits it out as an outage, instead of failing the job."""
    admin = redis.Redis.from_url(private_redis)
    admin.config_set("busy-reply-threshold", 100)  # ms
    spin = "local e = tonumber(redis.call('TIME')[1]) + 2; while tonumber(redis.call('TIME')[1]) < e do end"
    runner = threading.Thread(target=lambda: redis.Redis.from_url(private_redis).eval(spin, 0), daemon=True)
    transport = connect(new_job_id("busy"), redis_url=private_redis, amqp_url=amqp_url, role="worker", rank=0)
    try:
        runner.start()
        time.sleep(0.5)
        with pytest.raises(redis.ResponseError, match="BUSY"):  # what redis-py raises while the script runs
            admin.get("anything")
        transport.put("checkpoint:0", b"written once Redis answers again")
        runner.join(timeout=10)
        assert transport.get_many(["checkpoint:0"])[0] is not None
    finally:
        transport.delete_job()
        transport.close()
