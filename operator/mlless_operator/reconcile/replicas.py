"""The workers' replica count on each backend, and which ranks the pod backend deletes and creates.

Knative's pinned scale annotations, OpenFaaS's scale labels, or the set of rank
pods follow the count. Knative and OpenFaaS pick which replica goes
themselves; the supervisor only ever invokes the ranks it keeps, so a surplus
replica just idles until it is removed.

The pod backend chooses pods by rank (`mlless_operator.ranks`):
- scale-in deletes first the pods of ranks the supervisor took out
  (status.removedRanks), and pods that have finished, then the highest ranks;
  a deleted pod's worker gets SIGTERM, on which a still-running worker leaves
  gracefully. For status.removedRanks to steer a tuner's scale-in, the
  supervisor writes it before it patches the scale subresource.
- scale-out creates new ranks above the highest one used this session
  (existing pods, status.removedRanks, and the job's `mlless.io/highest-rank`
  annotation, which remembers pods deleted without a trace). A rank is never
  reused: the supervisor adopts an unknown rank that says hello as a joiner,
  while a reused one would collide with its predecessor's Redis keys and queue.

A session starts with ranks 0..N-1, which a new supervisor expects: at creation
and at each resume from suspension (`reconcile.suspension`). status.removedRanks
is the supervisor's; a resumed supervisor starts its own list.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import kopf

from mlless.contract import ANNOTATION_HIGHEST_RANK
from mlless_operator.builders.jobref import JobRef
from mlless_operator.builders.knative import knative_scale_annotations
from mlless_operator.builders.names import knative_service_name, openfaas_function_name, selector_labels, worker_pod_name
from mlless_operator.builders.openfaas import openfaas_scale_labels
from mlless_operator.builders.worker_pods import build_worker_pod
from mlless_operator.kubeapi import KubeAPI
from mlless_operator.ranks import plan_pod_scale


def highest_rank(body: Mapping[str, Any]) -> int:
    """The highest rank the operator created this session (-1 if none is recorded)."""
    raw = (body["metadata"].get("annotations") or {}).get(ANNOTATION_HIGHEST_RANK)
    try:
        return int(raw)
    except (TypeError, ValueError):
        return -1


def remember_highest_rank(patch: kopf.Patch, rank: int | None) -> None:
    """Record on the job the highest rank now used (None: not the pod backend, nothing to record)."""
    if rank is not None:
        patch.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_HIGHEST_RANK] = str(rank)


def removed_ranks(status: Mapping[str, Any]) -> list[int]:
    return [int(r) for r in status.get("removedRanks") or [] if isinstance(r, int) or str(r).isdigit()]


async def scale_pods(api: KubeAPI, job: JobRef, workers: int, removed: Iterable[int] = (), highest_used: int = -1) -> tuple[list[str], int]:
    """Bring the rank pods to `workers`; returns what changed and the highest rank now used."""
    pods = await api.list("v1", "Pod", job.namespace, selector_labels(job, "worker"))
    plan = plan_pod_scale(pods, workers, removed, highest_used)
    changes: list[str] = []
    for name in plan.delete:
        if await api.delete("v1", "Pod", job.namespace, name):
            changes.append(f"deleted Pod/{name}")
    for rank in plan.create:
        if await api.ensure(build_worker_pod(job, rank), update=False) == "created":
            changes.append(f"created Pod/{worker_pod_name(job, rank)}")
    return changes, plan.highest


async def scale_workers(
    api: KubeAPI, job: JobRef, workers: int, removed: Iterable[int] = (), highest_used: int = -1, missing_ok: bool = False
) -> tuple[list[str], int | None]:
    """Bring the backend to `workers` replicas (0 stops them all); returns what changed and, for pods, the highest rank.

    `missing_ok`: a Knative Service or OpenFaaS Function that is not there is
    already at zero (stopping); otherwise it is retried until it appears.
    """
    if job.backend == "pod":
        return await scale_pods(api, job, workers, removed, highest_used)
    if job.backend == "knative":
        api_version, kind, ns, name = "serving.knative.dev/v1", "Service", job.namespace, knative_service_name(job)
        body: dict[str, Any] = {"spec": {"template": {"metadata": {"annotations": knative_scale_annotations(workers)}}}}
    elif job.backend == "openfaas":
        api_version, kind, ns, name = "openfaas.com/v1", "Function", job.config.openfaas_namespace, openfaas_function_name(job)
        body = {"spec": {"labels": openfaas_scale_labels(workers)}}
    else:  # pragma: no cover - choose_backend only returns the three
        raise kopf.PermanentError(f"unknown backend {job.backend}")
    if await api.patch(api_version, kind, ns, name, body) is None:
        if missing_ok:
            return [], None
        raise kopf.TemporaryError(f"the {kind} {ns}/{name} is not there (yet)", delay=10)
    return [f"patched {kind}/{name} scale to {workers}"], None
