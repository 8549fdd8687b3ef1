"""spec.backoffLimit: recreate a supervisor pod that failed or went missing; fail the job once no restart is left.

A supervisor pod fails (phase Failed: a crash, an OOM kill, an eviction) or
goes missing (deleted by something other than the operator: a drain, a node
lost and its pods garbage-collected, `kubectl delete pod`). Either way the
status timer asks `replace_supervisor` what to do:
- a restart is left: the old pod is deleted (the API server removes a finished
  pod at once, so the name is free) and its successor created with the same
  spec, only its annotation counting the restarts. It runs with the same job
  id, Secret, Redis and RabbitMQ, and resumes the job from Redis by itself;
  the job keeps its phase;
- none is left: the job fails, and the failed pod stays for `kubectl logs`.

The count is what the newest pod says (`ANNOTATION_SUPERVISOR_RESTART`) or,
when it is gone, status.supervisorRestarts; the status is written only once
the successor exists. So a tick interrupted anywhere neither loses a restart
nor counts one twice. Nothing of the job's state (Secret, Redis, RabbitMQ) is
touched here: a successor needs all of it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from mlless.contract import ANNOTATION_SUPERVISOR_RESTART
from mlless_operator import backends
from mlless_operator.builders.jobref import JobRef
from mlless_operator.builders.names import supervisor_name
from mlless_operator.conditions import supervisor_restarts
from mlless_operator.kubeapi import KubeAPI

#: metav1.Condition's reason format; a pod's own reason (OOMKilled, Evicted, Error) passes through when it fits.
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


@dataclass(frozen=True)
class Replacement:
    """What became of a failed or missing supervisor: `restarts` so far (the successor's count when `restarted`),
    and why it needed replacing (`reason`, CamelCase, and `cause`, for people)."""

    restarted: bool
    restarts: int
    reason: str
    cause: str


def pod_restarts(pod: Mapping[str, Any] | None, status: Mapping[str, Any] | None) -> int:
    """Restarts before this pod: its annotation, or status.supervisorRestarts if more (a pod created without the
    count, by an operator restarted meanwhile, must not reset it)."""
    raw = (((pod or {}).get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SUPERVISOR_RESTART)
    try:
        own = int(raw)
    except (TypeError, ValueError):
        own = 0
    return max(own, supervisor_restarts(status))


def failure(pod: Mapping[str, Any] | None) -> tuple[str, str]:
    """(reason, cause) of a failed supervisor pod, or of one that is gone: an eviction's reason and message, else
    the container's exit code, reason and message."""
    if pod is None:
        return "SupervisorDeleted", "the supervisor pod was deleted"
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or {}
        if term:
            text = f"exit code {term.get('exitCode')}: {term.get('reason') or ''} {term.get('message') or ''}".strip()
            reason = status.get("reason") or term.get("reason") or ""
            if status.get("message"):
                text = f"{status['message']} ({text})"
            return (reason if _REASON.match(reason) else "SupervisorFailed"), text
    reason = status.get("reason") or ""
    return (reason if _REASON.match(reason) else "SupervisorFailed"), status.get("message") or "the supervisor pod failed"


async def replace_supervisor(api: KubeAPI, job: JobRef, pod: Mapping[str, Any] | None, status: Mapping[str, Any]) -> Replacement:
    """Recreate the failed (`pod`) or missing (None) supervisor if spec.backoffLimit allows another restart."""
    before = pod_restarts(pod, status)
    reason, cause = failure(pod)
    if before >= job.backoff_limit:
        return Replacement(False, before, reason, cause)
    if pod is not None:
        # The uid precondition: never delete a successor that an earlier, interrupted tick already created.
        await api.delete("v1", "Pod", job.namespace, supervisor_name(job), uid=pod["metadata"].get("uid"))
    await api.ensure_pod(backends.supervisor_pod(job, before + 1))
    return Replacement(True, before + 1, reason, cause)
