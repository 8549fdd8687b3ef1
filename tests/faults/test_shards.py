"""Redis sharding (`spec.redis.shards`, `--redis-url` repeated; mlless.transport.shards) over private Redis instances.

Where each key lands, reads that go to every shard at once, and the repair of one shard that restarted without
persistence, from one transport up to a whole `mlless train` job and a supervisor killed and resumed. Each test
starts its own Redis instances (faults/conftest.py); the shared Redis is never used here.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
import yaml

from mlless.contract import STOP_MAX_STEPS
from mlless.protocol import keys
from mlless.runtime.local import new_job_id
from mlless.runtime.supervisor.failover import STATE_FILE
from mlless.transport import connect
from mlless.transport.admin import delete_job_keys
from mlless.transport.shards import ShardMap

from faults.conftest import redis_server
from faults.test_outages import assert_a_lost_frame_is_published_again
from faults.test_failover import KILL_AT, assert_whole_job, finish, kill_at, manifest, reference, train  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.services]


@pytest.fixture
def shards() -> Iterator[list[str]]:
    """Two Redis instances of this test's own, without persistence: the job's shards 0 and 1."""
    with redis_server() as first, redis_server() as second:
        yield [f"redis://127.0.0.1:{first}/0", f"redis://127.0.0.1:{second}/0"]


def keys_on(url: str, job_id: str) -> set[str]:
    """The job's keys on one shard, without the job prefix, the transport's own marks left out."""
    names = {k.decode().split(":", 2)[-1] for k in redis.Redis.from_url(url).scan_iter(match=f"mlless:{job_id}:*")}
    return {n for n in names if not n.startswith(("_alive:", "_ranks"))}


def restart_empty(url: str) -> AbstractContextManager[int]:
    """Shut the Redis at `url` down without saving and start it again, empty, on the same port."""
    subprocess.run(["redis-cli", "-u", url, "shutdown", "nosave"], capture_output=True, timeout=30)
    time.sleep(1)
    return redis_server(port=urlsplit(url).port)


def test_the_shard_of_a_key_is_its_owners_rank_or_partition_mod_the_shard_count():
    two, three = ShardMap(2), ShardMap(3)
    assert [two.shard(keys.update(r, 7, 3)) for r in range(5)] == [0, 1, 0, 1, 0]
    assert [three.shard(keys.checkpoint(r)) for r in range(4)] == [0, 1, 2, 0]
    assert two.shard(keys.final_replica(3)) == two.shard(keys.leaver_replica(3)) == two.shard(keys.snapshot_pending(3)) == 1
    assert two.shard("update:5:2:1") == 1  # ScatterReduce: rank 5's partition 1 lives with rank 5's slots
    assert three.shard("reduced:2:update:0:4") == 2  # partition 2's merged frame
    for job_level in (keys.snapshot(), keys.job_state(), keys.job_checkpoint()):
        assert two.shard(job_level) == three.shard(job_level) == 0
    assert two.shard("update:x:1") == two.shard("update:\u0661:0") == 0  # no ASCII rank: shard 0
    assert {ShardMap(1).shard(keys.update(r, 1, 0)) for r in range(8)} == {0}


def test_keys_land_on_their_shards_and_a_read_goes_to_every_shard_at_once(shards, amqp_url):
    job_id = new_job_id("shards")
    t = connect(job_id, redis_url=" ".join(shards), amqp_url=amqp_url, role="worker", rank=1)
    # Each rank writes its own update slots (a worker may write no other rank's: protocol/keys.py).
    peers = {r: connect(job_id, redis_url=" ".join(shards), amqp_url=amqp_url, role="worker", rank=r)
             for r in (0, 2, 3)}
    try:
        for rank in range(4):
            peers.get(rank, t).put(keys.update(rank, 0, 0), f"frame of {rank}".encode())
        t.put(keys.snapshot(), b"snapshot")
        assert keys_on(shards[0], job_id) == {keys.update(0, 0, 0), keys.update(2, 0, 0), keys.snapshot()}
        assert keys_on(shards[1], job_id) == {keys.update(1, 0, 0), keys.update(3, 0, 0)}
        names = [keys.update(3, 0, 0), keys.snapshot(), keys.update(1, 1, 0), keys.update(0, 0, 0)]
        assert t.get_many(names) == [b"frame of 3", b"snapshot", None, b"frame of 0"]  # in the order asked
        assert t.store_instances == 2  # two Redis VMs in the job's cost

        # Both shards hold every client's commands for 1 s: one read over both takes 1 s, not one after the other.
        for url in shards:
            redis.Redis.from_url(url).execute_command("CLIENT", "PAUSE", 1000)
        started = time.monotonic()
        assert t.get_many(names)[0] == b"frame of 3"
        assert 0.9 < time.monotonic() - started < 1.8

        assert t.store_epoch == 0
        redis.Redis.from_url(shards[1]).flushall()  # shard 1 lost the job's keys
        t.get_many([keys.snapshot()])  # a read reaches only shard 0 ...
        assert t.store_epoch == 0
        t.probe_store()  # ... a probe every shard
        assert t.store_epoch == 1
    finally:
        for peer in peers.values():
            peer.close()
        assert t.delete_job() == 3  # shard 0's three keys of the caller; shard 1's were flushed
        t.close()
    assert keys_on(shards[0], job_id) == keys_on(shards[1], job_id) == set()


def test_deleting_a_jobs_keys_from_outside_covers_every_shard(shards):
    job_id = new_job_id("admin")
    for url in shards:
        redis.Redis.from_url(url).set(f"mlless:{job_id}:x", b"1")
    assert delete_job_keys(" ".join(shards), job_id) == 2
    assert all(redis.Redis.from_url(url).dbsize() == 0 for url in shards)


def test_a_frame_a_restarted_shard_lost_is_published_again_by_its_sender(shards, amqp_url, movielens_dir):
    """Worker 1's frames live on shard 1, and only shard 1 loses the job's keys: worker 0 finds worker 1's frame
    missing, and worker 1, waiting for a step-close, probes every shard and publishes it again. Shard 0 keeps its
    keys, and each worker notices the loss once."""
    def lose(job_id: str) -> None:
        redis.Redis.from_url(shards[0]).set(f"mlless:{job_id}:{keys.snapshot()}", b"kept")
        redis.Redis.from_url(shards[1]).flushall()

    def check(job_id: str, key: str) -> None:
        assert keys_on(shards[0], job_id) == {keys.snapshot()} and keys_on(shards[1], job_id) == {key}

    assert_a_lost_frame_is_published_again(" ".join(shards), amqp_url, movielens_dir, 1, lose, check)


def sharded_job(tmp_path: Path, dataset: Path, shards: list[str], amqp_url: str) -> tuple[subprocess.Popen, Path]:
    manifest_ = {"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "sharded"},
                 "spec": {"workers": 2, "model": {"type": "pmf"}, "sync": {"protocol": "bsp"},
                          "dataset": {"uri": str(dataset), "cacheBatches": True}, "stop": {"maxSteps": 240, "patience": 0},
                          "evaluation": {"everySteps": 10}}}
    job, run_dir = tmp_path / "sharded.yaml", tmp_path / "run"
    job.write_text(yaml.safe_dump(manifest_))
    flags = [arg for url in shards for arg in ("--redis-url", url)]
    return subprocess.Popen([sys.executable, "-m", "mlless", "train", str(job), "--out", str(run_dir), "-q", *flags,
                             "--amqp-url", amqp_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), run_dir


def wait_rows(run_dir: Path, proc: subprocess.Popen, rows: int) -> None:
    deadline, metrics = time.monotonic() + 120, run_dir / "metrics.jsonl"
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= rows):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_job_over_two_shards_loses_no_update_when_one_restarts(shards, amqp_url, movielens_dir, tmp_path):
    """`mlless train` with --redis-url twice: both shards carry the job's frames; shard 1, restarted empty mid-job,
    is repaired by the workers re-publishing, and the BSP replicas agree at the end as in an undisturbed run."""
    proc, run_dir = sharded_job(tmp_path, movielens_dir, shards, amqp_url)
    wait_rows(run_dir, proc, 30)
    on_shards = [{k.decode() for k in redis.Redis.from_url(u).scan_iter(match="mlless:*:update:*")} for u in shards]
    assert all(on_shards), on_shards  # each shard holds update slots
    with restart_empty(shards[1]):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        said = "\n".join(line for line in err.splitlines() if "WARNING" in line or "ERROR" in line)[-3000:]
        assert summary["stop_reason"] == STOP_MAX_STEPS and summary["steps"] == 240, said
        assert summary["workers_final"] == 2 and summary["dropped_workers"] == [] and summary["rejected_frames"] == 0
        assert summary["replica_spread"] < 1e-4
        assert all(redis.Redis.from_url(u).keys(f"mlless:{summary['job_id']}:*") == [] for u in shards)
    assert "the store lost the job's keys; re-published" in (run_dir / "logs" / "worker-1.log").read_text()


def test_a_killed_supervisor_resumes_over_two_shards_after_one_restarted(shards, amqp_url, movielens_dir, tmp_path,
                                                                         reference):  # noqa: F811
    """The supervisor is killed; shard 1 restarts empty meanwhile (worker 1's slots and registry gone); the
    successor (`--resume`) takes over from the surviving workers' replicas and the job ends as good as an
    uninterrupted run. Its job-level state lives on shard 0, which kept it."""
    services = [arg for url in shards for arg in ("--redis-url", url)] + ["--amqp-url", amqp_url]
    job, run_dir = manifest(tmp_path, movielens_dir, "sharded-killed"), tmp_path / "run"
    kill_at(train(job, run_dir, *services), run_dir, KILL_AT)
    job_id = json.loads((run_dir / STATE_FILE).read_text())["job_id"]
    assert keys.job_state() in keys_on(shards[0], job_id) and keys.job_state() not in keys_on(shards[1], job_id)
    with restart_empty(shards[1]):
        finish(train(job, run_dir, "--resume", *services))
        summary = assert_whole_job(run_dir, reference, gaps_allowed=2)
        assert summary["takeovers"][0]["from"] == "replicas of 2 surviving workers"
        assert all(redis.Redis.from_url(u).keys(f"mlless:{job_id}:*") == [] for u in shards)
