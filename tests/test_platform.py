"""The supervisor and its platform: progress mirrored out, scale and suspend requests taken in.

`RecordingPlatform` stands where `KubePlatform` stands on Kubernetes (which
`test_kube_platform.py` tests against the API emulator); here it records
what the supervisor tells it and answers polls as a job owner would. The
supervisor, its workers (real processes), Redis and RabbitMQ are real.
"""
from __future__ import annotations

import os

import math
import threading
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pytest
import redis

from mlless.contract import STOP_MAX_STEPS, STOP_SUSPENDED
from mlless.protocol import keys
from mlless.launch.launcher import LocalLauncher
from mlless.runtime.local import new_job_id
from mlless.launch.platform import Platform, PlatformRequest
from mlless.runtime.supervisor.loop import Supervisor
from mlless.spec import TrainingJob
from mlless.transport import connect
from mlless.transport.credentials import identity as env_identity  # the session's issuer (tests/conftest.py)

from test_training import QUIET, _when_step, job_for, job_keys, read_metrics

pytestmark = pytest.mark.slow


class RecordingPlatform(Platform):
    def __init__(self) -> None:
        self.published: list[tuple[dict[str, Any], bool]] = []
        self.set_calls: list[tuple[int, int | None, str]] = []
        self.requests: list[PlatformRequest] = []
        self.supervisor: Supervisor | None = None
        self.lock = threading.Lock()

    def set_workers(self, desired: int, removed: int | None = None) -> None:
        # The state of the removed rank at this moment: the platform must hear of it only once it is gone.
        state = self.supervisor.workers[removed].state if self.supervisor and removed is not None else ""
        self.set_calls.append((desired, removed, state))

    def publish(self, status: Mapping[str, Any], final: bool = False) -> None:
        self.published.append((dict(status), final))

    def poll(self) -> PlatformRequest | None:
        with self.lock:
            return self.requests.pop(0) if self.requests else None

    def ask(self, request: PlatformRequest) -> None:
        with self.lock:
            self.requests.append(request)


def run(job: TrainingJob, job_id: str, run_dir: Path, redis_url: str, amqp_url: str, platform: Platform | None, during=None,
        successor: bool = False) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    job_file = run_dir / "job.json"
    job_file.write_text(job.to_json())
    launcher = LocalLauncher(job_file, {"MLLESS_JOB_ID": job_id, "REDIS_URL": redis_url, "AMQP_URL": amqp_url}, run_dir / "logs", env_identity(os.environ))
    transport = connect(job_id, role="supervisor", redis_url=redis_url, amqp_url=amqp_url)
    supervisor = Supervisor(job, job_id, transport, launcher, run_dir, QUIET, platform=platform, successor=successor)
    if isinstance(platform, RecordingPlatform):
        platform.supervisor = supervisor
    hook = threading.Thread(target=during, args=(supervisor,), daemon=True) if during else None
    if hook:
        hook.start()
    try:
        return supervisor.run()
    finally:
        transport.close()
        if hook:
            hook.join(timeout=5)


def test_progress_is_published_every_step_and_finally_with_the_model(movielens_dir, tmp_path, redis_url, amqp_url):
    platform = RecordingPlatform()
    exported = tmp_path / "exported"
    job = job_for(movielens_dir, workers=2, stop={"maxSteps": 20}, output={"uri": str(exported)})
    summary = run(job, new_job_id("pub"), tmp_path / "run", redis_url, amqp_url, platform)
    steps = [status["step"] for status, final in platform.published if not final]
    assert steps == list(range(1, 21))
    last, final = platform.published[-1]
    # spec.output.uri outlives the run directory (which on Kubernetes dies with the supervisor pod).
    assert final and last["step"] == 20 and last["modelURI"] == f"{exported}/model.npz"
    assert sorted(p.name for p in exported.iterdir()) == ["metrics.jsonl", "model.npz", "summary.json"]
    assert (exported / "model.npz").read_bytes() == Path(summary["model_path"]).read_bytes()
    assert len((exported / "metrics.jsonl").read_text().splitlines()) == 20
    assert math.isfinite(last["trainLoss"]) and last["costUSD"] > 0
    assert last["costUSD"] == pytest.approx(summary["cost_usd"], abs=1e-6)
    # Like a Job's `active`, the count is of workers still running: 2 while training, none once the job is over.
    assert {status["workers"] for status, final in platform.published if not final} == {2} and last["workers"] == 0
    assert last["trainLoss"] == pytest.approx(summary["train_loss"])


def test_a_scale_request_from_the_platform_starts_a_joiner(movielens_dir, tmp_path, redis_url, amqp_url):
    platform = RecordingPlatform()

    def scale_out(supervisor: Supervisor) -> None:
        _when_step(supervisor, 5)
        platform.ask(PlatformRequest(workers=3))
        while 2 not in supervisor.live and supervisor.stop_reason is None:
            threading.Event().wait(0.05)
        _when_step(supervisor, supervisor.closed + 10)
        supervisor.request_stop("test done")

    job = job_for(movielens_dir, workers=2, stop={"maxSteps": 100000, "maxSeconds": 120, "patience": 0})
    summary = run(job, new_job_id("out"), tmp_path, redis_url, amqp_url, platform, scale_out)
    assert summary["stop_reason"] == "test done" and summary["workers_final"] == 3
    assert [e["event"] for e in summary["scaling_events"]] == ["launch", "join"]
    assert platform.set_calls == []  # the platform asked; nothing to tell it back


def test_the_tuner_reports_a_removed_rank_only_after_it_has_left(movielens_dir, tmp_path, redis_url, amqp_url):
    platform = RecordingPlatform()

    def remove_one(supervisor: Supervisor) -> None:
        _when_step(supervisor, 10)
        # What the tuner does on a "remove" decision (the tuner itself is tested in test_autotuner.py).
        supervisor.scaling.remove_worst(supervisor.closed, "test")
        # The job goes on until a survivor has merged the leaver's replica: on a loaded machine its Left can come
        # after a fixed step limit, and the finish then takes its replica in as a final one (three, not two).
        while not supervisor.scaling.merged and supervisor.stop_reason is None:
            threading.Event().wait(0.05)
        _when_step(supervisor, supervisor.closed + 5)
        supervisor.request_stop("test done")

    job = job_for(movielens_dir, stop={"maxSteps": 100000, "maxSeconds": 120, "patience": 0})
    summary = run(job, new_job_id("tune"), tmp_path, redis_url, amqp_url, platform, remove_one)
    [leave] = [e for e in summary["scaling_events"] if e["event"] == "leave"]
    assert summary["stop_reason"] == "test done"
    assert platform.set_calls == [(2, leave["rank"], "left")]
    assert summary["workers_final"] == 2


def test_suspend_checkpoints_the_model_and_a_new_supervisor_resumes_from_it(movielens_dir, tmp_path, redis_url, amqp_url):
    job_id = new_job_id("suspend")
    job = job_for(movielens_dir, workers=2, stop={"maxSteps": 60})
    first = RecordingPlatform()

    def suspend_at_25(supervisor: Supervisor) -> None:
        _when_step(supervisor, 25)
        first.ask(PlatformRequest(suspend=True))

    suspended = run(job, job_id, tmp_path / "first", redis_url, amqp_url, first, suspend_at_25)
    assert suspended["stop_reason"] == STOP_SUSPENDED
    final, is_final = first.published[-1]
    assert is_final and final["checkpointStep"] == suspended["steps"]
    # Every key of the job is gone except the checkpoint the resumed job starts from, kept for 30 days, not one.
    assert [k.decode().rsplit(":", 1)[-1] for k in job_keys(redis_url, job_id)] == [keys.job_checkpoint()]
    assert redis.Redis.from_url(redis_url).ttl(f"mlless:{job_id}:{keys.job_checkpoint()}") > 29 * 24 * 3600

    second = RecordingPlatform()
    resumed = run(job, job_id, tmp_path / "second", redis_url, amqp_url, second)
    assert resumed["stop_reason"] == STOP_MAX_STEPS
    # Step numbering and the batch cursor continue; the job stops at 60 steps in all, and its summary counts them all.
    assert resumed["steps"] == 60
    assert second.published[-1][0]["step"] == 60
    first_losses = [r["loss"] for r in read_metrics(tmp_path / "first")]
    resumed_rows = read_metrics(tmp_path / "second")
    assert [r["step"] for r in resumed_rows] == list(range(suspended["steps"] + 1, 61))
    resumed_losses = [r["loss"] for r in resumed_rows]
    # Started from the checkpoint, not from scratch: the first resumed steps train like the last suspended ones
    # (five steps each: a blocked step's loss is its stratum's, and three of them missed by 0.055 once under load).
    assert np.mean(resumed_losses[:3]) < np.mean(first_losses[:3]) - 0.05
    assert np.mean(resumed_losses[:5]) == pytest.approx(np.mean(first_losses[-5:]), abs=0.05)
    assert job_keys(redis_url, job_id) == []  # a job that ends normally leaves no checkpoint behind
