"""The PodsHealthy condition: why a job's pods are not getting anywhere, within one status tick.

A pod that cannot start or keeps crashing leaves a job Pending or silently
short of workers: an image that cannot be pulled, a pod no node can take, a
container in CrashLoopBackOff, a Secret key a container needs and cannot find.
The kubelet and the scheduler say so only on the pod; this puts it on the job,
where `kubectl describe tj` shows it: status False, the first stuck pod's
reason, and a message naming every stuck pod with the kubelet's or the
scheduler's message. It turns True again once none is stuck.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from mlless.contract import LABEL_JOB
from mlless_operator import backends
from mlless_operator.builders.jobref import JobRef
from mlless_operator.conditions import FINISHED_POD_PHASES, get_condition, set_condition
from mlless_operator.kubeapi import KubeAPI

#: Waiting reasons of a container that will not get better on its own (the kubelet's names).
STUCK_WAITING = frozenset({
    "ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull",
    "CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
})
#: A message longer than this is cut: conditions are for people, and the API server caps them at 32 KiB.
MAX_MESSAGE = 1024


def pod_problem(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) if the pod is stuck: a container waiting for a reason in STUCK_WAITING, or the pod
    unschedulable; None if it is fine, finished or on its way out."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") in FINISHED_POD_PHASES:
        return None
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_WAITING:
            return waiting["reason"], f"container {cs.get('name')}: {waiting.get('message') or waiting['reason']}"
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False" and condition.get("reason") == "Unschedulable":
            return "Unschedulable", condition.get("message") or "no node can take the pod"
    return None


def health(pods: Iterable[Mapping[str, Any]]) -> tuple[str, str, str]:
    """(status, reason, message) of the PodsHealthy condition for a job's pods."""
    stuck = sorted(((p["metadata"]["name"], problem) for p in pods if (problem := pod_problem(p)) is not None))
    if not stuck:
        return "True", "PodsHealthy", "no pod of the job is stuck"
    message = "; ".join(f"pod {name}: {reason}: {text}" for name, (reason, text) in stuck)
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    return "False", stuck[0][1][0], message


async def job_pods(api: KubeAPI, job: JobRef) -> list[dict[str, Any]]:
    """Every pod of the job: the supervisor, Redis, RabbitMQ and the workers in its namespace, and the workers its
    backend runs elsewhere (an OpenFaaS Function's, in the OpenFaaS namespace, where jobs of other namespaces may share
    a name)."""
    pods = await api.list("v1", "Pod", job.namespace, {LABEL_JOB: job.name})
    for namespace, labels in backends.get(job.backend).foreign_pods(job):
        pods += await api.list("v1", "Pod", namespace, labels)
    return pods


async def pods_healthy(api: KubeAPI, job: JobRef, conditions: list[Mapping[str, Any]] | None, generation: int | None) -> list[Mapping[str, Any]] | None:
    """`conditions` with PodsHealthy brought up to date, or as they are if it already says the same."""
    status, reason, message = health(await job_pods(api, job))
    current = get_condition({"conditions": conditions}, "PodsHealthy")
    if current is not None and (current.get("status"), current.get("reason"), current.get("message")) == (status, reason, message):
        return conditions
    return set_condition(conditions, "PodsHealthy", status, reason, message, generation)
