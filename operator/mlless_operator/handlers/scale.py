"""A change of spec.workers (`kubectl scale tj/x --replicas=N`, or the tuner through the scale subresource).

The backend's replica count follows: Knative's pinned scale annotations,
OpenFaaS's scale labels, or the set of rank pods. Scale-in removes the highest
ranks; each deleted pod gets SIGTERM, on which the worker leaves gracefully.
"""
from __future__ import annotations

import logging
from typing import Any

import kopf

from mlless_operator import builders as b
from mlless_operator.config import Config
from mlless_operator.kubeapi import KubeAPI
from mlless_operator.status import TERMINAL_PHASES, is_invalid


async def scale_workers(api: KubeAPI, job: b.JobRef, workers: int) -> list[str]:
    """Bring the backend to `workers` replicas; returns what changed."""
    changes: list[str] = []
    if job.backend == "pod":
        pods = await api.list("v1", "Pod", job.namespace, b.selector_labels(job, "worker"))
        for pod in pods:
            rank = int((pod["metadata"].get("labels") or {}).get(b.LABEL_RANK, -1))
            if rank >= workers and not pod["metadata"].get("deletionTimestamp"):
                if await api.delete("v1", "Pod", job.namespace, pod["metadata"]["name"]):
                    changes.append(f"deleted Pod/{pod['metadata']['name']}")
        for rank in range(workers):
            if await api.ensure(b.build_worker_pod(job, rank), update=False) == "created":
                changes.append(f"created Pod/{b.worker_pod_name(job, rank)}")
    elif job.backend == "knative":
        body = {"spec": {"template": {"metadata": {"annotations": b.knative_scale_annotations(workers)}}}}
        if await api.patch("serving.knative.dev/v1", "Service", job.namespace, b.knative_service_name(job), body) is None:
            raise kopf.TemporaryError("the Knative Service is not there (yet)", delay=10)
        changes.append(f"patched Service/{b.knative_service_name(job)} scale to {workers}")
    elif job.backend == "openfaas":
        body = {"spec": {"labels": b.openfaas_scale_labels(workers)}}
        if await api.patch("openfaas.com/v1", "Function", job.config.openfaas_namespace, b.openfaas_function_name(job), body) is None:
            raise kopf.TemporaryError("the OpenFaaS Function is not there (yet)", delay=10)
        changes.append(f"patched Function/{b.openfaas_function_name(job)} scale to {workers}")
    return changes


async def rescale(body: kopf.Body, old: Any, new: Any, patch: kopf.Patch, memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter, **_: Any) -> None:
    if old is None or new is None or old == new:
        return  # creation: the create handler makes the workers
    status = body.get("status") or {}
    if status.get("phase") in TERMINAL_PHASES or is_invalid(status):
        return
    backend = (body["metadata"].get("annotations") or {}).get(b.ANNOTATION_BACKEND)
    if backend not in b.BACKENDS:
        raise kopf.TemporaryError("the job's children are not created yet", delay=5)
    config: Config = memo.config
    job = b.JobRef.from_body(body, config, backend)
    changes = await scale_workers(memo.api, job, int(new))
    # Until the supervisor mirrors the workers it actually has, the status follows the desired count.
    patch.status["workers"] = int(new)
    logger.info("scaled %s from %s to %s: %s", job.name, old, new, changes)
    kopf.info(dict(body), reason="Scaled", message=f"workers {old} -> {new} on {backend}")
