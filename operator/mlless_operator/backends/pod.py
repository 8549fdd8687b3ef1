"""The pod backend: Pod `NAME-worker-RANK` running `mlless worker`, one per rank, which the supervisor waits for.

Scaling deletes and creates pods by rank (`mlless_operator.ranks` says which); a rank is never reused within a
session, and the job's `mlless.io/highest-rank` annotation (`reconcile.replicas`) remembers the highest one so far.
Each rank's pod reads its own identity alone from the job Secret, handed out before the pod is made and retired
once it is deleted (`reconcile.identities`).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from mlless.contract import ENV_JOB_FILE, ENV_RANK, LABEL_RANK, WORKER_INVOCATION_EXTERNAL
from mlless_operator.backends.base import Backend, Session
from mlless_operator.builders.credentials import ca_mounts, ca_volumes, rank_identity_key, service_env
from mlless_operator.builders.jobfile import JOB_FILE
from mlless_operator.builders.jobref import JobRef, Manifest
from mlless_operator.builders.names import dns_name, metadata, selector_labels
from mlless_operator.builders.podspec import container_security_context, pod_security_context
from mlless_operator.builders.runtime import JOB_VOLUME, TMP_VOLUME, common_env, cores_env, function_resources, identity_env, runtime_volumes, user_env
from mlless_operator.kubeapi import KubeAPI
from mlless_operator.ranks import plan_pod_scale, pod_rank, removed_ranks
from mlless_operator.reconcile import identities


def worker_pod_name(job: JobRef, rank: int) -> str:
    return dns_name(job.name, "worker", str(rank))


def build_worker_pod(job: JobRef, rank: int) -> Manifest:
    """Worker `rank` as a plain Pod running `mlless worker` (the pod backend)."""
    env = [
        {"name": ENV_JOB_FILE, "value": JOB_FILE},
        *common_env(job),
        {"name": ENV_RANK, "value": str(rank)},
        cores_env(job),
        identity_env(job, rank_identity_key(rank)),  # its own, and no other rank's
        *service_env(job),
        *user_env(job),
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(job, worker_pod_name(job, rank), "worker", {LABEL_RANK: str(rank)}),
        "spec": {
            "restartPolicy": "OnFailure",
            "automountServiceAccountToken": False,
            # On SIGTERM a worker publishes its replica and announces that it leaves; give it time.
            "terminationGracePeriodSeconds": 60,
            "securityContext": pod_security_context(),
            "containers": [
                {
                    "name": "worker",
                    "image": job.worker_image,
                    "command": ["mlless", "worker"],
                    "env": env,
                    "resources": function_resources(job),
                    "securityContext": container_security_context(),
                    "volumeMounts": [JOB_VOLUME, TMP_VOLUME, *ca_mounts(job)],
                }
            ],
            "volumes": runtime_volumes(job, *ca_volumes(job)),
        },
    }


async def scale_pods(api: KubeAPI, job: JobRef, workers: int, removed: Iterable[int] = (), highest_used: int = -1) -> tuple[list[str], int]:
    """Bring the rank pods to `workers`; returns what changed and the highest rank now used."""
    pods = await api.list("v1", "Pod", job.namespace, selector_labels(job, "worker"))
    plan = plan_pod_scale(pods, workers, removed, highest_used)
    changes: list[str] = []
    for name in plan.delete:
        if await api.delete("v1", "Pod", job.namespace, name):
            changes.append(f"deleted Pod/{name}")
    ranks = {pod["metadata"]["name"]: pod_rank(pod) for pod in pods}
    await identities.retire(api, job, [rank for name in plan.delete if (rank := ranks.get(name)) is not None])
    await identities.hand_out(api, job, plan.create)
    for rank in plan.create:
        if await api.ensure(build_worker_pod(job, rank), update=False) == "created":
            changes.append(f"created Pod/{worker_pod_name(job, rank)}")
    return changes, plan.highest


class PodBackend(Backend):
    """Workers as plain pods: available on every cluster, and the fallback when the one asked for is not served."""

    name = "pod"
    invocation = WORKER_INVOCATION_EXTERNAL

    async def ensure_workers(self, api: KubeAPI, job: JobRef, session: Session, status: Mapping[str, Any],
                             highest_used: int) -> tuple[dict[str, str], int | None]:
        if session == "start":
            results = {}
            await identities.hand_out(api, job, range(job.workers), only=True)
            for rank in range(job.workers):
                pod = build_worker_pod(job, rank)
                results[f"Pod/{pod['metadata']['name']}"] = await api.ensure_pod(pod)
            return results, job.workers - 1
        # A missing worker is replaced by a new rank, never re-created under its old one.
        changes, highest = await scale_pods(api, job, job.workers, removed_ranks(status), highest_used)
        return {what: verb for verb, what in (change.split(" ", 1) for change in changes)}, highest  # "created Pod/x"

    async def scale(self, api: KubeAPI, job: JobRef, workers: int, removed: Iterable[int] = (), highest_used: int = -1,
                    missing_ok: bool = False) -> tuple[list[str], int | None]:
        return await scale_pods(api, job, workers, removed, highest_used)
