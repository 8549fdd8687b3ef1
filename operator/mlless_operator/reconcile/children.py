"""Make every child of a job exist, idempotently.

Each child is ensured with get-then-create(-or-patch), so running this again
after an operator restart, or after a crash half-way, creates only what is
missing and never fails on what is already there.

The runtime (supervisor pod and workers) comes in one of three ways:
- `start`: a new session (creation, resume from suspension): the supervisor
  and workers of ranks 0..N-1, which a new supervisor waits for;
- `continue`: the operator restarted mid-session: the backend makes its
  workers whole again (the pod backend replaces a missing worker by a new
  rank, never re-creating it under its old one);
- `none`: the job is suspended, or suspending, and `reconcile.suspension` owns
  the runtime; only the state (Secret, ConfigMap, Redis, RabbitMQ and their
  NetworkPolicy, RBAC) is ensured.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from mlless_operator import backends
from mlless_operator.builders.credentials import build_secret
from mlless_operator.builders.jobfile import build_job_configmap
from mlless_operator.builders.jobref import JobRef
from mlless_operator.builders.names import redis_shards
from mlless_operator.builders.network import build_network_policy
from mlless_operator.builders.services import (
    build_rabbitmq_service,
    build_rabbitmq_statefulset,
    build_redis_service,
    build_redis_statefulset,
)
from mlless_operator.builders.supervisor import (
    build_supervisor_role,
    build_supervisor_role_binding,
    build_supervisor_service,
    build_supervisor_service_account,
)
from mlless_operator.conditions import supervisor_restarts
from mlless_operator.kubeapi import KubeAPI

Runtime = Literal["start", "continue", "none"]


@dataclass
class Ensured:
    results: dict[str, str] = field(default_factory=dict)  # 'Kind/name' -> created | patched | unchanged
    highest_rank: int | None = None  # pod backend: the highest worker rank now used, to remember on the job


async def ensure_children(api: KubeAPI, job: JobRef, runtime: Runtime = "start", status: Mapping[str, Any] | None = None, highest_used: int = -1) -> Ensured:
    """Make every child exist; `status` and `highest_used` steer the ranks of a `continue`d pod session."""
    ensured = Ensured()
    backend = backends.get(job.backend)

    async def ensure(obj: dict[str, Any], update: bool = True) -> None:
        ensured.results[f"{obj['kind']}/{obj['metadata']['name']}"] = await api.ensure(obj, update=update)

    # Generated passwords must never change once services use them: create only.
    await ensure(build_secret(job), update=False)
    await ensure(build_job_configmap(job))
    if job.external("redis") is None:
        for shard in range(len(redis_shards(job))):
            await ensure(build_redis_service(job, shard))
            await ensure(build_redis_statefulset(job, shard))
    if job.external("rabbitmq") is None:
        await ensure(build_rabbitmq_service(job))
        await ensure(build_rabbitmq_statefulset(job))
    policy = build_network_policy(job, backend.foreign_pods(job)) if job.config.network_policy else None
    if policy is not None:
        await ensure(policy)
    await ensure(build_supervisor_service_account(job))
    await ensure(build_supervisor_role(job))
    await ensure(build_supervisor_role_binding(job))
    await ensure(build_supervisor_service(job))
    if runtime == "none":
        return ensured
    supervisor = backends.supervisor_pod(job, supervisor_restarts(status))
    ensured.results[f"Pod/{supervisor['metadata']['name']}"] = await api.ensure_pod(supervisor)
    workers, ensured.highest_rank = await backend.ensure_workers(api, job, runtime, status or {}, highest_used)
    ensured.results.update(workers)
    return ensured
