"""A change of spec.workers (`kubectl scale tj/x --replicas=N`, or the supervisor through the scale subresource).

The backend's replica count follows (`Backend.scale`; the pod backend also
chooses which rank pods go and which come). Nothing changes for a finished or invalid
job, nor while a suspension owns the runtime: the resume starts spec.workers workers.
"""
from __future__ import annotations

import logging
from typing import Any

import kopf

from mlless.contract import ANNOTATION_BACKEND, TERMINAL_JOB_PHASES
from mlless_operator import backends
from mlless_operator.builders.jobref import JobRef
from mlless_operator.conditions import is_invalid
from mlless_operator.config import Config
from mlless_operator.ranks import removed_ranks
from mlless_operator.reconcile.replicas import highest_rank, remember_highest_rank
from mlless_operator.reconcile.suspension import owns_runtime


async def rescale(body: kopf.Body, old: Any, new: Any, patch: kopf.Patch, memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter, **_: Any) -> None:
    if old is None or new is None or old == new:
        return  # creation: the create handler makes the workers
    status = body.get("status") or {}
    if status.get("phase") in TERMINAL_JOB_PHASES or is_invalid(status):
        return
    if owns_runtime(body):
        return  # no workers while suspended (or suspending); the resume starts spec.workers of them
    backend = (body["metadata"].get("annotations") or {}).get(ANNOTATION_BACKEND)
    if not backends.known(backend):
        raise kopf.TemporaryError("the job's children are not created yet", delay=5)
    config: Config = memo.config
    job = JobRef.from_body(body, config, backend)
    changes, highest = await backends.get(backend).scale(memo.api, job, int(new), removed_ranks(status), highest_rank(body))
    remember_highest_rank(patch, highest)
    # Provisional: the supervisor (which owns status.workers) mirrors the workers it actually has.
    patch.status["workers"] = int(new)
    logger.info("scaled %s from %s to %s: %s", job.name, old, new, changes)
    kopf.info(dict(body), reason="Scaled", message=f"workers {old} -> {new} on {backend}" + (f": {', '.join(changes)}" if changes else ""))
