"""Supervisor failover: a supervisor killed mid-job, and the one that takes over.

`mlless train` (a supervisor process, real worker processes) is killed with -9 and run again with
`--resume`: over Redis and RabbitMQ its surviving workers hand in their replicas, on the embedded
transport (which dies with it) the run directory's checkpoint is the model. Either way the step count,
the run record and the cost continue, and the model ends as good as an uninterrupted run's.
On Kubernetes the successor is a new supervisor pod with an empty run directory: everything comes from Redis.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import redis
import yaml

from mlless.contract import STOP_INTERRUPTED, STOP_MAX_STEPS
from mlless.protocol import keys, layouts
from mlless.protocol.framing import decode
from mlless.runtime.local import new_job_id
from mlless.runtime.supervisor.failover import (
    CHECKPOINT_FILE, STATE_FILE, Checkpoint, JobState,
)
from mlless.runtime.supervisor.loop import Supervisor
from mlless.stopping.rules import Best

from faults.test_supervisor_loss import alive, children
from test_platform import run
from test_training import _when_step, job_for, job_keys, read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.services]

STEPS = 400
KILL_AT = 150


def manifest(tmp_path: Path, dataset: Path, name: str, steps: int = STEPS, **spec: object) -> Path:
    """A two-worker PMF job under BSP, or what `spec` sets instead."""
    spec = {"workers": 2, "model": {"type": "pmf"}, "sync": {"protocol": "bsp"},
            "dataset": {"uri": str(dataset), "cacheBatches": True}, "stop": {"maxSteps": steps, "patience": 0},
            "evaluation": {"everySteps": 10}, **spec}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob",
                                    "metadata": {"name": name}, "spec": spec}))
    return path


def train(job: Path, run_dir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mlless", "train", str(job), "--out", str(run_dir), "-q", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return err


def rows_written(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def kill_at(proc: subprocess.Popen, run_dir: Path, rows: int) -> list[int]:
    """kill -9 the supervisor once `rows` steps are recorded; returns its workers' pids."""
    deadline = time.monotonic() + 120
    while rows_written(run_dir) < rows:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    workers = children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    return workers


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def assert_whole_job(run_dir: Path, reference: dict, gaps_allowed: int, total: int = STEPS) -> dict:
    """The resumed job's record covers every one of its `total` steps once, and its model is as good as the
    uninterrupted one's."""
    summary = summary_of(run_dir)
    assert summary["stop_reason"] == STOP_MAX_STEPS and summary["steps"] == total
    steps = [r["step"] for r in read_metrics(run_dir)]
    assert steps == sorted(set(steps)) and steps[-1] == total
    # Resumed from survivors, the rows of the steps closed since the last row written are missing (a row waits for
    # the next step's barrier timings, so the newest one or two rows die with a killed supervisor).
    assert len(steps) >= total - gaps_allowed
    assert abs(summary["validation_loss"] - reference["validation_loss"]) < 0.01
    assert summary["replica_spread"] < 1e-4  # BSP: the replicas agree, as in an undisturbed run
    for name in (STATE_FILE, CHECKPOINT_FILE, "issuer"):  # nothing is left to resume
        assert not (run_dir / name).exists(), name
    return summary


@pytest.fixture(scope="module")
def reference(movielens_dir, tmp_path_factory) -> dict:
    """The same job, uninterrupted."""
    tmp = tmp_path_factory.mktemp("reference")
    finish(train(manifest(tmp, movielens_dir, "reference"), tmp / "run"))
    return summary_of(tmp / "run")


def test_a_killed_supervisor_is_resumed_from_its_surviving_workers(movielens_dir, tmp_path, reference, redis_url, amqp_url):
    services = ("--redis-url", redis_url, "--amqp-url", amqp_url)
    job, run_dir = manifest(tmp_path, movielens_dir, "killed"), tmp_path / "run"
    workers = kill_at(train(job, run_dir, *services), run_dir, KILL_AT)
    killed_at = json.loads((run_dir / STATE_FILE).read_text())
    recorded = rows_written(run_dir)
    finish(train(job, run_dir, "--resume", *services))
    assert not any(alive(w) for w in workers)  # they handed in their replicas and ended
    summary = assert_whole_job(run_dir, reference, gaps_allowed=2)
    [takeover] = summary["takeovers"]
    assert takeover["from"] == "replicas of 2 surviving workers" and takeover["run"] == 2
    assert recorded <= takeover["step"] <= recorded + 2  # where the workers were, not an older checkpoint
    assert summary["job_id"] == killed_at["job_id"]
    # The cost and the wall time include the killed run's.
    assert summary["wall_seconds"] > killed_at["wall_seconds"]
    assert summary["cost_usd"] > reference["cost_usd"] * 0.9
    assert job_keys(redis_url, summary["job_id"]) == []
    queues = subprocess.run(["rabbitmqctl", "list_queues", "--quiet", "--no-table-headers", "name"],
                            capture_output=True, text=True).stdout
    assert summary["job_id"] not in queues


NETWORK_STEPS = 150


def network_manifest(tmp_path: Path, dataset: Path, name: str) -> Path:
    """A small network on the digits, under gradient averaging with Adam (the neural-net defaults)."""
    return manifest(tmp_path, dataset, name, NETWORK_STEPS, sync={"protocol": "gradient-averaging"},
                    model={"type": "neural-net", "network": "mlp", "hiddenSizes": [32]})


@pytest.fixture(scope="module")
def network_reference(digits_dir, tmp_path_factory) -> dict:
    """The network's job, uninterrupted."""
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("network-reference")
    finish(train(network_manifest(tmp, digits_dir, "reference"), tmp / "run"))
    return summary_of(tmp / "run")


def test_a_killed_supervisor_of_a_network_resumes_exactly_from_its_surviving_workers(
        digits_dir, tmp_path, network_reference, redis_url, amqp_url, audit):
    """Gradient averaging's replicas step one Adam state: the job checkpoint carries it (its moments and step count),
    and the resumed job's first step trains the batches at its cursor, so the job ends on the very parameters an
    uninterrupted run ends on. Before, the resumed workers started Adam afresh, and their first step trained the
    job's first batches again."""
    services = ("--redis-url", redis_url, "--amqp-url", amqp_url)
    job, run_dir = network_manifest(tmp_path, digits_dir, "killed"), tmp_path / "run"
    workers = kill_at(train(job, run_dir, *services), run_dir, 50)
    before = read_metrics(run_dir)
    # The killed supervisor's newest checkpoint (of an evaluated snapshot) holds the optimizer's state at its step:
    # Adam took one step per closed step.
    checkpoint = decode((run_dir / CHECKPOINT_FILE).read_bytes())
    state, params = layouts.optimizer_state(checkpoint.arrays), checkpoint.arrays[layouts.PARAMS]
    assert sorted(state) == ["m", "t", "v"] and int(state["t"][0]) == checkpoint.step > 0
    assert state["m"].shape == state["v"].shape == params.shape and np.all(state["v"] >= 0) and state["v"].max() > 0
    finish(train(job, run_dir, "--resume", *services))
    assert not any(alive(w) for w in workers)
    summary = assert_whole_job(run_dir, network_reference, gaps_allowed=2, total=NETWORK_STEPS)
    [takeover] = summary["takeovers"]
    assert takeover["from"] == "replicas of 2 surviving workers" and 50 <= takeover["step"] < NETWORK_STEPS
    assert summary["replica_spread"] == 0.0
    # Exactly the uninterrupted run's model: the final replicas' loss to the last bit.
    assert summary["final_validation_loss"] == network_reference["final_validation_loss"]
    # MLLESS_AUDIT: the final replicas are the model the resumed workers started from plus every step since, once.
    assert summary["audit"]["checked"] and summary["audit"]["max_error"] < 1e-5, summary["audit"]
    # It kept learning after the kill.
    at_kill = [r["validation_loss"] for r in before if r["validation_loss"] is not None][-1]
    assert summary["final_validation_loss"] < at_kill - 0.1, (at_kill, summary["final_validation_loss"])
    assert job_keys(redis_url, summary["job_id"]) == []


def test_a_killed_supervisor_is_resumed_from_its_checkpoint_on_the_embedded_transport(movielens_dir, tmp_path, reference):
    job, run_dir = manifest(tmp_path, movielens_dir, "embedded"), tmp_path / "run"
    workers = kill_at(train(job, run_dir), run_dir, KILL_AT)
    recorded = rows_written(run_dir)  # the kill lands a few steps after KILL_AT rows were seen
    deadline = time.monotonic() + 30
    while any(alive(w) for w in workers) and time.monotonic() < deadline:  # the broker died with the supervisor
        time.sleep(0.1)
    finish(train(job, run_dir, "--resume"))
    summary = assert_whole_job(run_dir, reference, gaps_allowed=0)
    [takeover] = summary["takeovers"]
    # A checkpoint of a step the killed run reached: at most the one after its last row (rows are written a step late).
    assert takeover["from"] == "checkpoint" and 0 < takeover["step"] <= recorded + 1


def test_ctrl_c_then_resume_continues_from_the_final_replicas(movielens_dir, tmp_path, reference):
    job, run_dir = manifest(tmp_path, movielens_dir, "interrupted"), tmp_path / "run"
    proc = train(job, run_dir)
    while rows_written(run_dir) < KILL_AT:
        assert proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    interrupted = summary_of(run_dir)
    assert interrupted["stop_reason"] == STOP_INTERRUPTED
    assert (run_dir / "issuer").stat().st_mode & 0o077 == 0  # kept for --resume, readable by its owner only
    assert f"--out {run_dir} --resume" in err  # it says how to go on
    # Issue #22: without --resume (or --force) a new job must not overwrite the one that can still be resumed.
    key_before = (run_dir / "issuer").read_bytes()
    refused = subprocess.run([sys.executable, "-m", "mlless", "train", str(job), "--out", str(run_dir), "-q"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"mlless: error: {run_dir}: holds a job that can still be resumed; continue it with --resume, or start over "
        "with --force (its record and issuer are replaced)"]
    assert (run_dir / "issuer").read_bytes() == key_before
    finish(train(job, run_dir, "--resume"))
    summary = assert_whole_job(run_dir, reference, gaps_allowed=0)
    [takeover] = summary["takeovers"]
    assert (takeover["run"], takeover["step"], takeover["from"]) == (2, interrupted["steps"], "checkpoint")
    assert 0 < takeover["seconds"] < 30


def test_resume_needs_a_run_directory_with_a_job_to_resume(movielens_dir, tmp_path):
    job = manifest(tmp_path, movielens_dir, "nothing")
    proc = subprocess.run([sys.executable, "-m", "mlless", "train", str(job), "--resume"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "mlless: error: --resume continues the job of a run directory: give it with --out RUNDIR"]
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-m", "mlless", "train", str(job), "--out", str(empty), "--resume"],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"mlless: error: {empty}: nothing to resume (no {STATE_FILE}: the job completed, or never ran there)"]
    (empty / STATE_FILE).write_text('{"job_id": "x", "steps": "many"}')
    proc = subprocess.run([sys.executable, "-m", "mlless", "train", str(job), "--out", str(empty), "--resume"],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert str(empty / STATE_FILE) in proc.stderr and "steps: expected int, got str" in proc.stderr


# ---- a successor supervisor pod: an empty run directory, everything from Redis --------------------------------------


def test_a_successor_pod_takes_over_from_what_redis_kept(movielens_dir, tmp_path, redis_url, amqp_url):
    """SIGTERM (an evicted supervisor pod): the job's state stays in Redis, and a new supervisor with an empty run
    directory continues it, its run record included."""
    job_id = new_job_id("successor")
    job = job_for(movielens_dir, workers=2, stop={"maxSteps": 60})

    def terminate_at_25(supervisor: Supervisor) -> None:
        _when_step(supervisor, 25)
        supervisor._on_signal(signal.SIGTERM, None)

    first = run(job, job_id, tmp_path / "first", redis_url, amqp_url, None, terminate_at_25, successor=True)
    assert first["stop_reason"] == STOP_INTERRUPTED
    kept = {k.decode().split(":", 2)[-1] for k in job_keys(redis_url, job_id)}
    assert {keys.job_state(), keys.job_checkpoint(), keys.job_rows(0)} <= kept

    second = run(job, job_id, tmp_path / "second", redis_url, amqp_url, None, successor=True)
    assert second["stop_reason"] == STOP_MAX_STEPS and second["steps"] == 60
    first_rows, rows = read_metrics(tmp_path / "first"), read_metrics(tmp_path / "second")
    assert [r["step"] for r in rows] == list(range(1, 61))
    assert rows[:first["steps"]] == first_rows[:first["steps"]]  # the predecessor's rows, from Redis
    assert second["wall_seconds"] > first["wall_seconds"] and second["cost_usd"] > first["cost_usd"]
    assert job_keys(redis_url, job_id) == []  # the job completed: nothing is kept for another successor
    assert redis.Redis.from_url(redis_url).exists(f"mlless:{job_id}:{keys.job_state()}") == 0


# ---- the state's pieces -------------------------------------------------------------------------------------------


def test_job_state_round_trips_and_rejects_what_it_did_not_write():
    state = JobState("job-1", steps=10, cursor=20, run_step=4, live=2, wall_seconds=3.5,
                     worker_seconds=[1.0, 2.5], train_loss=0.7, dropped_workers=[{"rank": 1, "step": 3, "reason": "x"}])
    assert JobState.from_json(state.to_json()) == state
    for bad, field in ((b"[]", "JSON object"), (b"\xff", "not JSON"), (b'{"job_id": "x"}', "steps: missing")):
        with pytest.raises(ValueError, match=field):
            JobState.from_json(bad)
    raw = json.loads(state.to_json())
    for name, value in (("steps", -1), ("steps", 1.5), ("steps", True), ("worker_seconds", ["a"]), ("ended", 0)):
        with pytest.raises(ValueError, match=name):
            JobState.from_json(json.dumps(raw | {name: value}).encode())


def test_a_checkpoint_carries_the_position_the_best_snapshot_and_a_shared_optimizer_state():
    params, best = np.arange(6, dtype=np.float32), np.ones(6, np.float32)
    checkpoint = Checkpoint(12, 30, params, Best(8, 0.5, best))
    read = Checkpoint.read(checkpoint.frame(), params)
    assert (read.steps, read.cursor, read.best.step, read.best.loss) == (12, 30, 8, 0.5)
    assert np.array_equal(read.params, params) and np.array_equal(read.best.params, best)
    assert read.optimizer is None
    # Gradient averaging's replicas share one Adam state: a worker of the resumed job starts from it.
    adam = {"m": np.full(6, 0.25, np.float32), "v": np.full(6, 0.5, np.float32), "t": np.array([12], np.int64)}
    frame = Checkpoint(12, 30, params, optimizer=adam).frame()
    read = Checkpoint.read(frame, params)
    assert sorted(read.optimizer) == ["m", "t", "v"] and all(np.array_equal(read.optimizer[k], adam[k]) for k in adam)
    # What a worker restores (`Replica.restore`): the frame read as any replica's, its optimizer state under its names.
    assert layouts.optimizer_state(decode(frame).arrays).keys() == adam.keys()
    with pytest.raises(ValueError, match="replica is float32"):
        Checkpoint.read(checkpoint.frame(), np.zeros(7, np.float32))  # another model's


def test_merging_survivors_keeps_every_unsent_update_once():
    shared = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    pending = [(np.array([0, 2], np.int32), np.array([0.5, 1.0], np.float32)),
               (np.array([2], np.int32), np.array([-0.25], np.float32))]
    replicas = []
    for idx, val in pending:
        replica = shared.copy()
        replica[idx] += val  # a replica is the shared model plus what it has not sent yet
        replicas.append(replica)
    merged = layouts.model_of([layouts.replica_arrays(r, p) for r, p in zip(replicas, pending)])
    assert np.allclose(merged, shared + np.array([0.5, 0, 0.75, 0]))
    assert not np.allclose(merged, np.mean(replicas, axis=0))  # averaging would halve the unsent updates
