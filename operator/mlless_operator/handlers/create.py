"""Create (and resume): validate the spec, then make every child exist, idempotently.

Each child is ensured with get-then-create(-or-patch), so running this again
after an operator restart, or after a crash half-way, creates only what is
missing and never fails on what is already there.

The runtime (supervisor pod and workers) comes in one of three ways:
- `start`: a new session (creation, resume from suspension): the supervisor
  and workers of ranks 0..N-1, which a new supervisor waits for;
- `continue`: the operator restarted mid-session: a missing worker is replaced
  by a new rank, never re-created under its old one (handlers/scale.py);
- `none`: the job is suspended, or suspending, and handlers/suspend.py owns
  the runtime; only the state (Secret, ConfigMap, Redis, RabbitMQ, RBAC) is ensured.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

import kopf

from mlless.contract import ANNOTATION_BACKEND, ANNOTATION_HIGHEST_RANK, TERMINAL_JOB_PHASES
from mlless.spec import SpecError, from_manifest
from mlless_operator import builders as b
from mlless_operator import metrics
from mlless_operator.backends import choose_backend, served_backends
from mlless_operator.config import Config
from mlless_operator.credentials import openfaas_secrets
from mlless_operator.handlers.scale import highest_rank, removed_ranks, scale_pods
from mlless_operator.kubeapi import KubeAPI
from mlless_operator.status import is_invalid, is_true, now, set_condition

Runtime = Literal["start", "continue", "none"]


def spec_error(body: Mapping[str, Any]) -> str | None:
    """None if the spec is valid, else the field paths and what is wrong with them."""
    meta = body["metadata"]
    manifest = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "metadata": {"name": meta["name"]}, "spec": dict(body.get("spec") or {})}
    try:
        from_manifest(manifest, source=f"{meta.get('namespace')}/{meta['name']}")
    except SpecError as exc:
        lines = [line.strip() for line in str(exc).splitlines()[1:] if line.strip()]
        return "; ".join(lines) or str(exc)
    spec = manifest["spec"]
    for field_path, uri in (("spec.dataset.uri", (spec.get("dataset") or {}).get("uri")), ("spec.output.uri", (spec.get("output") or {}).get("uri"))):
        # `mlless train` resolves these against the manifest's folder; a pod has no such folder.
        if uri and "://" not in uri and not uri.startswith("/"):
            return f"{field_path}: {uri!r} is a relative path, which cannot resolve inside a pod; use a URL such as s3://bucket/prefix or an absolute path"
    return None


@dataclass
class Ensured:
    results: dict[str, str] = field(default_factory=dict)  # 'Kind/name' -> created | patched | unchanged
    highest_rank: int | None = None  # pod backend: the highest worker rank now used, to remember on the job


async def ensure_pod(api: KubeAPI, pod: dict[str, Any]) -> str:
    """Create a pod unless it exists. One still terminating must go first: a Pod's spec is immutable, and a new
    supervisor or worker must not be mistaken for the old one that is on its way out (after a suspension)."""
    meta = pod["metadata"]
    current = await api.get("v1", "Pod", meta["namespace"], meta["name"])
    if current is not None and current["metadata"].get("deletionTimestamp"):
        raise kopf.TemporaryError(f"Pod {meta['name']} is still terminating; waiting to create its successor", delay=5)
    return await api.ensure(pod, update=False)


async def ensure_children(api: KubeAPI, job: b.JobRef, runtime: Runtime = "start", status: Mapping[str, Any] | None = None, highest_used: int = -1) -> Ensured:
    """Make every child exist; `status` and `highest_used` steer the ranks of a `continue`d pod session."""
    ensured = Ensured()

    async def ensure(obj: dict[str, Any], update: bool = True) -> None:
        ensured.results[f"{obj['kind']}/{obj['metadata']['name']}"] = await api.ensure(obj, update=update)

    # Generated passwords must never change once services use them: create only.
    await ensure(b.build_secret(job), update=False)
    await ensure(b.build_job_configmap(job))
    if job.external("redis") is None:
        await ensure(b.build_redis_service(job))
        await ensure(b.build_redis_statefulset(job))
    if job.external("rabbitmq") is None:
        await ensure(b.build_rabbitmq_service(job))
        await ensure(b.build_rabbitmq_statefulset(job))
    await ensure(b.build_supervisor_service_account(job))
    await ensure(b.build_supervisor_role(job))
    await ensure(b.build_supervisor_role_binding(job))
    await ensure(b.build_supervisor_service(job))
    if runtime == "none":
        return ensured
    supervisor = b.build_supervisor_pod(job)
    ensured.results[f"Pod/{supervisor['metadata']['name']}"] = await ensure_pod(api, supervisor)
    if job.backend == "pod":
        if runtime == "start":
            for rank in range(job.workers):
                pod = b.build_worker_pod(job, rank)
                ensured.results[f"Pod/{pod['metadata']['name']}"] = await ensure_pod(api, pod)
            ensured.highest_rank = job.workers - 1
        else:
            changes, ensured.highest_rank = await scale_pods(api, job, job.workers, removed_ranks(status or {}), highest_used)
            for change in changes:  # "created Pod/x", "deleted Pod/y"
                verb, what = change.split(" ", 1)
                ensured.results[what] = verb
    elif job.backend == "knative":
        await ensure(b.build_knative_service(job))
    elif job.backend == "openfaas":
        await ensure(b.build_openfaas_secret(job, await openfaas_secrets(api, job)))
        await ensure(b.build_openfaas_function(job))
    else:  # pragma: no cover - choose_backend only returns the three
        raise kopf.PermanentError(f"unknown backend {job.backend}")
    return ensured


def fail_invalid(body: Mapping[str, Any], patch: kopf.Patch, message: str) -> None:
    status = body.get("status") or {}
    generation = body["metadata"].get("generation")
    conditions = set_condition(status.get("conditions"), "Failed", "True", "InvalidSpec", message, generation)
    patch.status["phase"] = "Failed"
    patch.status["conditions"] = conditions
    patch.status["observedGeneration"] = generation
    patch.status["completionTime"] = status.get("completionTime") or now()  # so ttlSecondsAfterFinished applies
    metrics.observe_phase(body["metadata"].get("uid", ""), "Failed")
    kopf.warn(dict(body), reason="InvalidSpec", message=message)


def runtime_for(body: Mapping[str, Any], reason: Any) -> Runtime:
    status = body.get("status") or {}
    if (body.get("spec") or {}).get("suspend") or status.get("phase") == "Suspended" or is_true(status, "Suspended"):
        return "none"  # handlers/suspend.py stops and restarts the runtime
    return "continue" if str(reason) == "resume" else "start"


async def reconcile(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter, reason: Any = None, **_: Any) -> None:
    config: Config = memo.config
    api: KubeAPI = memo.api
    status = dict(body.get("status") or {})
    meta = body["metadata"]
    if str(reason) == "resume" and (status.get("phase") in TERMINAL_JOB_PHASES or is_invalid(status)):
        return  # a finished or invalid job has nothing to re-create
    message = spec_error(body)
    if message is not None:
        fail_invalid(body, patch, message)
        return

    backend = (meta.get("annotations") or {}).get(ANNOTATION_BACKEND)
    if backend not in b.BACKENDS:
        requested = ((body.get("spec") or {}).get("function") or {}).get("backend")
        backend, fallback = choose_backend(requested, await served_backends(api), config.default_backend)
        if fallback:
            kopf.warn(dict(body), reason="BackendFallback", message=fallback)
        # Remember the choice: scaling and cleanup must act on the backend the workers were created on.
        patch.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_BACKEND] = backend

    job = b.JobRef.from_body(body, config, backend)
    ensured = await ensure_children(api, job, runtime_for(body, reason), status, highest_rank(body))
    results = ensured.results
    created = sorted(k for k, v in results.items() if v == "created")
    logger.info("children of %s: %s", job.name, results)

    generation = meta.get("generation")
    conditions = set_condition(
        status.get("conditions"), "Created", "True", "ChildrenCreated",
        f"{len(results)} children on backend {backend}", generation,
    )
    if ensured.highest_rank is not None:
        patch.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_HIGHEST_RANK] = str(ensured.highest_rank)
    patch.status["conditions"] = conditions
    patch.status["phase"] = status.get("phase") or "Pending"
    if "workers" not in status:
        patch.status["workers"] = job.workers  # provisional, until the supervisor reports the workers it has
    patch.status["selector"] = b.worker_selector(job)
    patch.status["observedGeneration"] = generation
    # (startTime is set when the supervisor pod is first seen running: handlers/status.py.)
    metrics.observe_phase(job.uid, patch.status["phase"])
    if created:
        kopf.info(dict(body), reason="Created", message=f"created {', '.join(created)} (backend {backend})")
