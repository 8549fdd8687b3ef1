"""Create (and resume): validate the spec, then make every child exist, idempotently.

Each child is ensured with get-then-create(-or-patch), so running this again
after an operator restart, or after a crash half-way, creates only what is
missing and never fails on what is already there.
"""
from __future__ import annotations

import base64
import logging
from typing import Any, Mapping

import kopf

from mlless.spec import SpecError, from_manifest
from mlless_operator import builders as b
from mlless_operator import metrics
from mlless_operator.backends import choose_backend, served_backends
from mlless_operator.config import Config
from mlless_operator.kubeapi import KubeAPI
from mlless_operator.status import TERMINAL_PHASES, is_invalid, now, set_condition


def spec_error(body: Mapping[str, Any]) -> str | None:
    """None if the spec is valid, else the field paths and what is wrong with them."""
    meta = body["metadata"]
    manifest = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "metadata": {"name": meta["name"]}, "spec": dict(body.get("spec") or {})}
    try:
        from_manifest(manifest, source=f"{meta.get('namespace')}/{meta['name']}")
    except SpecError as exc:
        lines = [line.strip() for line in str(exc).splitlines()[1:] if line.strip()]
        return "; ".join(lines) or str(exc)
    return None


async def ensure_children(api: KubeAPI, job: b.JobRef) -> dict[str, str]:
    """Make every child exist; returns 'Kind/name' -> created | patched | unchanged."""
    results: dict[str, str] = {}

    async def ensure(obj: dict[str, Any], update: bool = True) -> None:
        results[f"{obj['kind']}/{obj['metadata']['name']}"] = await api.ensure(obj, update=update)

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
    await ensure(b.build_supervisor_pod(job), update=False)  # a Pod's spec is immutable
    await ensure_workers(api, job, ensure)
    return results


async def ensure_workers(api: KubeAPI, job: b.JobRef, ensure: Any) -> None:
    if job.backend == "pod":
        for rank in range(job.workers):
            await ensure(b.build_worker_pod(job, rank), update=False)
    elif job.backend == "knative":
        await ensure(b.build_knative_service(job))
    elif job.backend == "openfaas":
        secret = await api.get("v1", "Secret", job.namespace, b.secret_name(job))
        data = dict((secret or {}).get("data") or {})
        # Servers answer with base64 `data`; a client may have stored `stringData` (an emulator keeps it as sent).
        for key, value in ((secret or {}).get("stringData") or {}).items():
            data.setdefault(key, base64.b64encode(value.encode()).decode())
        await ensure(b.build_openfaas_secret(job, data))
        await ensure(b.build_openfaas_function(job))
    else:  # pragma: no cover - choose_backend only returns the three
        raise kopf.PermanentError(f"unknown backend {job.backend}")


def fail_invalid(body: Mapping[str, Any], patch: kopf.Patch, message: str) -> None:
    status = body.get("status") or {}
    generation = body["metadata"].get("generation")
    conditions = set_condition(status.get("conditions"), "Failed", "True", "InvalidSpec", message, generation)
    patch.status["phase"] = "Failed"
    patch.status["conditions"] = conditions
    patch.status["observedGeneration"] = generation
    metrics.observe_phase(body["metadata"].get("uid", ""), "Failed")
    kopf.warn(dict(body), reason="InvalidSpec", message=message)


async def reconcile(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter, reason: Any = None, **_: Any) -> None:
    config: Config = memo.config
    api: KubeAPI = memo.api
    status = dict(body.get("status") or {})
    meta = body["metadata"]
    if str(reason) == "resume" and (status.get("phase") in TERMINAL_PHASES or is_invalid(status)):
        return  # a finished or invalid job has nothing to re-create
    message = spec_error(body)
    if message is not None:
        fail_invalid(body, patch, message)
        return

    backend = (meta.get("annotations") or {}).get(b.ANNOTATION_BACKEND)
    if backend not in b.BACKENDS:
        requested = ((body.get("spec") or {}).get("function") or {}).get("backend")
        backend, fallback = choose_backend(requested, await served_backends(api), config.default_backend)
        if fallback:
            kopf.warn(dict(body), reason="BackendFallback", message=fallback)
        # Remember the choice: scaling and cleanup must act on the backend the workers were created on.
        patch.setdefault("metadata", {}).setdefault("annotations", {})[b.ANNOTATION_BACKEND] = backend

    job = b.JobRef.from_body(body, config, backend)
    results = await ensure_children(api, job)
    created = sorted(k for k, v in results.items() if v == "created")
    logger.info("children of %s: %s", job.name, results)

    generation = meta.get("generation")
    conditions = set_condition(
        status.get("conditions"), "Created", "True", "ChildrenCreated",
        f"{len(results)} children on backend {backend}", generation,
    )
    patch.status["conditions"] = conditions
    patch.status["phase"] = status.get("phase") or "Pending"
    patch.status["workers"] = job.workers
    patch.status["selector"] = b.worker_selector(job)
    patch.status["observedGeneration"] = generation
    if not status.get("startTime"):
        patch.status["startTime"] = now()
    metrics.observe_phase(job.uid, patch.status["phase"])
    if created:
        kopf.info(dict(body), reason="Created", message=f"created {', '.join(created)} (backend {backend})")
