"""Stop a job's runtime, keep its state: what suspension and activeDeadlineSeconds share.

The supervisor pod is deleted (SIGTERM: the supervisor ends cleanly) and the
workers stop: their backend scales them to zero (rank pods deleted, or a Knative
Service or OpenFaaS Function pinned to zero replicas).
Secret, ConfigMap, RBAC, Redis and RabbitMQ stay: a suspended job resumes from
its checkpoint in Redis, and a failed one keeps its state for inspection until
the job itself is deleted.
"""
from __future__ import annotations

from typing import Any, Mapping

from mlless_operator import backends
from mlless_operator.builders.jobref import JobRef
from mlless_operator.builders.names import supervisor_name
from mlless_operator.kubeapi import KubeAPI


async def stop_runtime(api: KubeAPI, job: JobRef, supervisor: Mapping[str, Any] | None) -> list[str]:
    """Delete the supervisor pod seen as `supervisor` (that incarnation only) and stop the workers; returns what changed."""
    changes: list[str] = []
    meta = (supervisor or {}).get("metadata") or {}
    if supervisor is not None and not meta.get("deletionTimestamp"):
        # The uid precondition: never delete a supervisor that a concurrent resume has just created under the same name.
        if await api.delete("v1", "Pod", job.namespace, supervisor_name(job), uid=meta.get("uid")):
            changes.append(f"deleted Pod/{supervisor_name(job)}")
    stopped, _ = await backends.get(job.backend).scale(api, job, 0, missing_ok=True)
    return changes + stopped
