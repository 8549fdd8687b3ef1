"""`mlless train`: one supervisor in this process and P worker processes on this machine.

With Redis and RabbitMQ URLs the job runs over those services; without them
the supervisor hosts the embedded broker and the workers connect to it. The
protocol code is the same either way. Each run makes its own issuer
(`mlless.protocol.identity`), which stays in this process: the supervisor seals
with an identity of its own, and each worker gets only its own identity in its
environment (`LocalLauncher`).
"""
from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mlless.contract import (
    ENV_AMQP_URL, ENV_ATTACK, ENV_EMBEDDED_ADDRESS, ENV_JOB_ID, ENV_REDIS_URL, ENV_ZYGOTE, joined_shard_urls,
)
from mlless.data.dataset import DatasetError
from mlless.telemetry.metrics import SupervisorMetrics
from mlless.launch.launcher import Launcher, LocalLauncher
from mlless.launch.platform import Platform
from mlless.launch.zygote import Zygote
from mlless.progress import Progress
from mlless.runtime.supervisor.failover import STATE_FILE, JobState, ResumeError, resumable
from mlless.runtime.supervisor.loop import Supervisor
from mlless.runtime.supervisor.membership import JobFailed
from mlless.spec import SpecError, TrainingJob
from mlless.spec.models import model_type
from mlless.spec.robust import STORE_EXCHANGES, one_redis_error
from mlless.transport import Transport, connect
from mlless.transport.embedded_broker import EmbeddedBroker
from mlless.protocol.identity import Issuer, parse_identity
from mlless.transport.base import SUPERVISOR
from mlless.transport.credentials import service_urls


#: The job's issuer in its run directory, while the job may be resumed.
ISSUER_FILE = "issuer"


@dataclass(frozen=True)
class Services:
    redis_url: str | None = None
    amqp_url: str | None = None

    @property
    def external(self) -> bool:
        return bool(self.redis_url and self.amqp_url)

    def worker_env(self) -> dict[str, str]:
        assert self.redis_url and self.amqp_url
        return {ENV_REDIS_URL: self.redis_url, ENV_AMQP_URL: self.amqp_url}


def services_from(redis_url: str | list[str] | None, amqp_url: str | None) -> Services:
    """The services the flags give, else REDIS_URL and AMQP_URL; ValueError unless both or neither are given.
    A list of Redis URLs (`--redis-url` repeated) is the job's shards, passed on space-separated as REDIS_URL
    carries them (mlless.transport.credentials)."""
    if isinstance(redis_url, list):
        redis_url = joined_shard_urls(redis_url)
    from_env = service_urls(os.environ)
    redis_url = redis_url or from_env.get(ENV_REDIS_URL)
    amqp_url = amqp_url or from_env.get(ENV_AMQP_URL)
    if bool(redis_url) != bool(amqp_url):
        raise ValueError("give both --redis-url and --amqp-url (or REDIS_URL and AMQP_URL), or neither for the "
                         "embedded transport")
    return Services(redis_url, amqp_url)


def new_job_id(name: str) -> str:
    """A per-run id: keys and queues of concurrent runs of one manifest never collide."""
    return f"{name}-{secrets.token_hex(4)}"


def resumed_job_id(run_dir: Path) -> str:
    """The id of the job whose state `run_dir` holds; ResumeError if it holds none."""
    path = run_dir / STATE_FILE
    if not path.exists():
        raise ResumeError(f"{run_dir}: nothing to resume (no {STATE_FILE}: the job completed, or never ran there)")
    try:
        return JobState.from_json(path.read_bytes()).job_id
    except (OSError, ValueError) as exc:
        raise ResumeError(f"{path}: not a job state: {exc}") from None


def train_local(
    job: TrainingJob, run_dir: Path, services: Services, progress: Progress, metrics_port: int | None = None,
    job_id: str | None = None, on_start: Callable[[Supervisor], None] | None = None,
    attack: str | None = None, zygote: Zygote | None = None,
) -> dict[str, Any]:
    """Train `job` here; with `metrics_port`, the supervisor serves Prometheus metrics on it meanwhile.

    With a `job_id` (`resumed_job_id`), continue that job, which ended on a fault, a Ctrl-C or a kill. `on_start`
    gets the supervisor before it starts, to stop the job from another thread (`Supervisor.request_stop`: a sweep). With an
    `attack` (RANK=KIND, runtime/attack.py), that worker publishes attacked updates: a robustness test. Workers are
    forked from `zygote` (a sweep's, shared by its trials), else from one of the job's own (`job_zygote`).
    """
    if job.sync.exchange in STORE_EXCHANGES and not services.external:
        raise SpecError(f"spec.sync.exchange: {job.sync.exchange} runs a script in Redis, which the embedded transport "
                        "has not: give --redis-url and --amqp-url")
    with job_zygote(job.model.type) if zygote is None else contextlib.nullcontext(zygote) as forks:
        return _train(job, run_dir, services, progress, metrics_port, job_id, on_start, attack, forks)


def job_zygote(model: str) -> contextlib.AbstractContextManager[Zygote | None]:
    """A zygote for the workers of a job (or a sweep) on `model`, ended with it; none with MLLESS_ZYGOTE=0. Started
    first, so that its imports, the model type's slow ones too, run beside the supervisor's own start."""
    return contextlib.nullcontext() if os.environ.get(ENV_ZYGOTE) == "0" else Zygote(model_type(model).imports)


def _train(
    job: TrainingJob, run_dir: Path, services: Services, progress: Progress, metrics_port: int | None,
    job_id: str | None, on_start: Callable[[Supervisor], None] | None, attack: str | None, zygote: Zygote | None,
) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    job_file = run_dir / "job.json"
    job_file.write_text(job.to_json())
    resuming = job_id is not None
    issuer = run_issuer(run_dir, resume=resuming)
    job_id = job_id or new_job_id(job.name)
    env = {ENV_JOB_ID: job_id} | ({ENV_ATTACK: attack} if attack else {})
    identity = issuer.issue(SUPERVISOR)
    try:
        if services.external:
            env |= services.worker_env()
            transport = connect(job_id, role="supervisor", redis_url=services.redis_url, amqp_url=services.amqp_url,
                                identity=identity)
            launcher = LocalLauncher(job_file, env, run_dir / "logs", issuer, zygote)
            summary = supervise(job, job_id, transport, launcher, run_dir, progress, metrics_port, on_start=on_start)
        else:
            with tempfile.TemporaryDirectory(prefix="mlless-") as tmp, EmbeddedBroker(str(Path(tmp) / "broker.sock")) as broker:
                env[ENV_EMBEDDED_ADDRESS] = broker.address
                transport = connect(job_id, role="supervisor", embedded_address=broker.address, identity=identity)
                launcher = LocalLauncher(job_file, env, run_dir / "logs", issuer, zygote)
                summary = supervise(job, job_id, transport, launcher, run_dir, progress, metrics_port,
                                    on_start=on_start)
    except (JobFailed, DatasetError, SpecError):
        if not resuming:  # a new job that failed before its first step (a corrupt batch): nothing to resume
            (run_dir / ISSUER_FILE).unlink(missing_ok=True)
        raise
    if not resumable(summary["stop_reason"]):
        (run_dir / ISSUER_FILE).unlink(missing_ok=True)
    return summary


def run_issuer(run_dir: Path, resume: bool) -> Issuer:
    """The job's issuer: a new one, kept in `run_dir` (owner-only) while the job may be resumed, or, to `resume`,
    that one: what certified the identities the job's surviving workers seal their frames with."""
    path = run_dir / ISSUER_FILE
    if resume:
        try:
            found = parse_identity(path.read_text())
        except OSError as exc:
            raise ResumeError(f"{path}: cannot read the job's issuer: {exc.strerror}") from None
        except ValueError as exc:
            raise ResumeError(f"{path}: {exc}") from None
        if not isinstance(found, Issuer):
            raise ResumeError(f"{path}: not an issuer")
        return found
    issuer = Issuer()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(issuer.text())
    return issuer


def supervise(
    job: TrainingJob,
    job_id: str,
    transport: Transport,
    launcher: Launcher,
    run_dir: Path,
    progress: Progress,
    metrics_port: int | None,
    platform: Platform | None = None,
    successor: bool = False,
    on_start: Callable[[Supervisor], None] | None = None,
) -> dict[str, Any]:
    """Run the supervisor to the end of the job, serving metrics meanwhile; closes the transport.

    With `successor`, a failed supervisor is restarted (Kubernetes): see `Supervisor`. SpecError if the job cannot
    run over this transport: in-store over a sharded Redis (`--redis-url` repeated, or several URLs in the pod's
    REDIS_URL for an external sharded Redis, which `spec.redis.shards` does not count)."""
    shards = transport.store_instances
    if refusal := one_redis_error(job.sync.exchange, shards, f"the job's Redis is {shards} shards"):
        transport.close()
        raise SpecError(refusal)
    metrics = SupervisorMetrics.for_job(job_id, job.pricing)
    if metrics_port is not None:
        port = metrics.serve(metrics_port)
        progress.message(f"Prometheus metrics on http://localhost:{port}/metrics")
    try:
        supervisor = Supervisor(job, job_id, transport, launcher, run_dir, progress, platform=platform,
                                metrics=metrics, successor=successor)
        if on_start is not None:
            on_start(supervisor)
        return supervisor.run()
    finally:
        metrics.close()
        transport.close()
