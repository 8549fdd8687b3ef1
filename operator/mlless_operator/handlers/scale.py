"""A change of spec.workers (`kubectl scale tj/x --replicas=N`, or the supervisor through the scale subresource).

The backend's replica count follows: Knative's pinned scale annotations,
OpenFaaS's scale labels, or the set of rank pods. Knative and OpenFaaS pick
which replica goes themselves; the supervisor only ever invokes the ranks it
keeps, so a surplus replica just idles until it is removed.

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
and at each resume from suspension (handlers/suspend.py). status.removedRanks is
the supervisor's; a resumed supervisor starts its own list.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping

import kopf

from mlless.contract import ANNOTATION_BACKEND, ANNOTATION_HIGHEST_RANK, TERMINAL_JOB_PHASES
from mlless_operator import builders as b
from mlless_operator.config import Config
from mlless_operator.kubeapi import KubeAPI
from mlless_operator.ranks import plan_pod_scale
from mlless_operator.status import is_invalid, is_true


def highest_rank(body: Mapping[str, Any]) -> int:
    """The highest rank the operator created this session (-1 if none is recorded)."""
    raw = (body["metadata"].get("annotations") or {}).get(ANNOTATION_HIGHEST_RANK)
    try:
        return int(raw)
    except (TypeError, ValueError):
        return -1


def removed_ranks(status: Mapping[str, Any]) -> list[int]:
    return [int(r) for r in status.get("removedRanks") or [] if isinstance(r, int) or str(r).isdigit()]


async def scale_pods(api: KubeAPI, job: b.JobRef, workers: int, removed: Iterable[int] = (), highest_used: int = -1) -> tuple[list[str], int]:
    """Bring the rank pods to `workers`; returns what changed and the highest rank now used."""
    pods = await api.list("v1", "Pod", job.namespace, b.selector_labels(job, "worker"))
    plan = plan_pod_scale(pods, workers, removed, highest_used)
    changes: list[str] = []
    for name in plan.delete:
        if await api.delete("v1", "Pod", job.namespace, name):
            changes.append(f"deleted Pod/{name}")
    for rank in plan.create:
        if await api.ensure(b.build_worker_pod(job, rank), update=False) == "created":
            changes.append(f"created Pod/{b.worker_pod_name(job, rank)}")
    return changes, plan.highest


async def scale_workers(
    api: KubeAPI, job: b.JobRef, workers: int, removed: Iterable[int] = (), highest_used: int = -1, missing_ok: bool = False
) -> tuple[list[str], int | None]:
    """Bring the backend to `workers` replicas (0 stops them all); returns what changed and, for pods, the highest rank.

    `missing_ok`: a Knative Service or OpenFaaS Function that is not there is
    already at zero (stopping); otherwise it is retried until it appears.
    """
    if job.backend == "pod":
        return await scale_pods(api, job, workers, removed, highest_used)
    if job.backend == "knative":
        api_version, kind, ns, name = "serving.knative.dev/v1", "Service", job.namespace, b.knative_service_name(job)
        body: dict[str, Any] = {"spec": {"template": {"metadata": {"annotations": b.knative_scale_annotations(workers)}}}}
    elif job.backend == "openfaas":
        api_version, kind, ns, name = "openfaas.com/v1", "Function", job.config.openfaas_namespace, b.openfaas_function_name(job)
        body = {"spec": {"labels": b.openfaas_scale_labels(workers)}}
    else:  # pragma: no cover - choose_backend only returns the three
        raise kopf.PermanentError(f"unknown backend {job.backend}")
    if await api.patch(api_version, kind, ns, name, body) is None:
        if missing_ok:
            return [], None
        raise kopf.TemporaryError(f"the {kind} {ns}/{name} is not there (yet)", delay=10)
    return [f"patched {kind}/{name} scale to {workers}"], None


async def rescale(body: kopf.Body, old: Any, new: Any, patch: kopf.Patch, memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter, **_: Any) -> None:
    if old is None or new is None or old == new:
        return  # creation: the create handler makes the workers
    status = body.get("status") or {}
    if status.get("phase") in TERMINAL_JOB_PHASES or is_invalid(status):
        return
    if (body.get("spec") or {}).get("suspend") or status.get("phase") == "Suspended" or is_true(status, "Suspended"):
        return  # no workers while suspended (or suspending); the resume starts spec.workers of them
    backend = (body["metadata"].get("annotations") or {}).get(ANNOTATION_BACKEND)
    if backend not in b.BACKENDS:
        raise kopf.TemporaryError("the job's children are not created yet", delay=5)
    config: Config = memo.config
    job = b.JobRef.from_body(body, config, backend)
    changes, highest = await scale_workers(memo.api, job, int(new), removed_ranks(status), highest_rank(body))
    if highest is not None:
        patch.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_HIGHEST_RANK] = str(highest)
    # Provisional: the supervisor (which owns status.workers) mirrors the workers it actually has.
    patch.status["workers"] = int(new)
    logger.info("scaled %s from %s to %s: %s", job.name, old, new, changes)
    kopf.info(dict(body), reason="Scaled", message=f"workers {old} -> {new} on {backend}" + (f": {', '.join(changes)}" if changes else ""))
