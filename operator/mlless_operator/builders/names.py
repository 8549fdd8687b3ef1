"""Names, labels and owner references of a job's children, and the ports its services listen on."""
from __future__ import annotations

import hashlib
from typing import Mapping

from mlless.contract import API_VERSION, KIND, LABEL_JOB, LABEL_ROLE
from mlless_operator.builders.jobref import JobRef, Manifest

REDIS_PORT = 6379
AMQP_PORT = 5672


def dns_name(*parts: str, limit: int = 63) -> str:
    """Join parts with '-'; if too long, truncate and add a short hash so names stay unique and valid."""
    name = "-".join(parts)
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


def child_name(job: JobRef, suffix: str) -> str:
    return dns_name(job.name, suffix)


def secret_name(job: JobRef) -> str:
    return child_name(job, "credentials")


def configmap_name(job: JobRef) -> str:
    return child_name(job, "job")


def redis_name(job: JobRef) -> str:
    return child_name(job, "redis")


def redis_shards(job: JobRef) -> list[tuple[str, str]]:
    """(name, role) of each shard of the job's managed Redis (`spec.redis.shards`): the first is the one Redis of an
    unsharded job, unchanged; shard k's StatefulSet, Service and pods' role are `redis-k`, so that each Service
    selects its own shard's pod."""
    count = int((job.spec.get("redis") or {}).get("shards") or 1)
    return [(redis_name(job), "redis")] + [(child_name(job, f"redis-{k}"), f"redis-{k}") for k in range(1, count)]


def rabbitmq_name(job: JobRef) -> str:
    return child_name(job, "rabbitmq")


def supervisor_name(job: JobRef) -> str:
    return child_name(job, "supervisor")










def labels(job: JobRef, role: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "mlless",
        "app.kubernetes.io/instance": job.name,
        "app.kubernetes.io/component": role,
        "app.kubernetes.io/managed-by": "mlless-operator",
        LABEL_JOB: job.name,
        LABEL_ROLE: role,
    }


def selector_labels(job: JobRef, role: str) -> dict[str, str]:
    return {LABEL_JOB: job.name, LABEL_ROLE: role}


def worker_selector(job: JobRef) -> str:
    """The scale subresource's label selector (status.selector)."""
    return ",".join(f"{k}={v}" for k, v in selector_labels(job, "worker").items())


def owner_references(job: JobRef) -> list[Manifest]:
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": job.name,
            "uid": job.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def metadata(job: JobRef, name: str, role: str, extra_labels: Mapping[str, str] | None = None) -> Manifest:
    """Metadata of a child in the job's namespace: owned by the job, so it goes with it."""
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": {**labels(job, role), **(extra_labels or {})},
        "ownerReferences": owner_references(job),
    }
