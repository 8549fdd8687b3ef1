"""Create (and resume): validate the spec, choose the backend, then make every child exist (`reconcile.children`).

On creation the runtime starts a new session; on resume (the operator
restarted) it continues the current one; while a suspension owns the runtime
only the state is ensured.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

import kopf

from mlless.contract import ANNOTATION_BACKEND, TERMINAL_JOB_PHASES
from mlless.spec import SpecError, from_manifest
from mlless_operator import metrics
from mlless_operator.backends import choose_backend, known, served_backends
from mlless_operator.builders.jobref import JobRef
from mlless_operator.builders.names import worker_selector
from mlless_operator.builders.runtime import quantity_errors
from mlless_operator.conditions import is_invalid, now, set_condition
from mlless_operator.config import Config
from mlless_operator.kubeapi import KubeAPI
from mlless_operator.reconcile.children import Runtime, ensure_children
from mlless_operator.reconcile.replicas import highest_rank, remember_highest_rank
from mlless_operator.reconcile.suspension import owns_runtime


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
    errors = quantity_errors(spec.get("function") or {})
    if errors:
        return "; ".join(errors)
    for field_path, uri in (("spec.dataset.uri", (spec.get("dataset") or {}).get("uri")), ("spec.output.uri", (spec.get("output") or {}).get("uri"))):
        # `mlless train` resolves these against the manifest's folder; a pod has no such folder.
        if uri and "://" not in uri and not uri.startswith("/"):
            return f"{field_path}: {uri!r} is a relative path, which cannot resolve inside a pod; use a URL such as s3://bucket/prefix or an absolute path"
    return None


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
    if owns_runtime(body):
        return "none"  # reconcile.suspension stops and restarts the runtime
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
    if not known(backend):  # (set by an earlier run, or by the user to pick a backend spec.function.backend cannot name)
        requested = ((body.get("spec") or {}).get("function") or {}).get("backend")
        backend, fallback = choose_backend(requested, await served_backends(api), config.default_backend)
        if fallback:
            kopf.warn(dict(body), reason="BackendFallback", message=fallback)
        # Remember the choice: scaling and cleanup must act on the backend the workers were created on.
        patch.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_BACKEND] = backend

    job = JobRef.from_body(body, config, backend)
    ensured = await ensure_children(api, job, runtime_for(body, reason), status, highest_rank(body))
    results = ensured.results
    created = sorted(k for k, v in results.items() if v == "created")
    logger.info("children of %s: %s", job.name, results)

    generation = meta.get("generation")
    conditions = set_condition(
        status.get("conditions"), "Created", "True", "ChildrenCreated",
        f"{len(results)} children on backend {backend}", generation,
    )
    remember_highest_rank(patch, ensured.highest_rank)
    patch.status["conditions"] = conditions
    patch.status["phase"] = status.get("phase") or "Pending"
    if "workers" not in status:
        patch.status["workers"] = job.workers  # provisional, until the supervisor reports the workers it has
    patch.status["selector"] = worker_selector(job)
    patch.status["observedGeneration"] = generation
    # (startTime is set when the supervisor pod is first seen running: handlers/status.py.)
    metrics.observe_phase(job.uid, patch.status["phase"])
    if created:
        kopf.info(dict(body), reason="Created", message=f"created {', '.join(created)} (backend {backend})")
