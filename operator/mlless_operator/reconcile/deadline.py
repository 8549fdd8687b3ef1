"""spec.activeDeadlineSeconds: fail a job that has run too long.

Running time counts from status.startTime, which the status timer sets when it
first sees the supervisor pod running (and which a suspension clears). Past the
deadline the job fails with reason DeadlineExceeded, and its supervisor pod and
workers are stopped: the supervisor handles SIGTERM as a clean interrupt, so
the model trained so far is still saved.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

import kopf

from mlless_operator import metrics
from mlless_operator.builders.jobref import JobRef
from mlless_operator.conditions import now, seconds_since, set_condition
from mlless_operator.kubeapi import KubeAPI
from mlless_operator.reconcile.teardown import stop_runtime


async def enforce_deadline(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter,
                           job: JobRef, supervisor: Mapping[str, Any] | None) -> bool:
    """Fail the job if it is past its deadline; True if it did."""
    status = dict(body.get("status") or {})
    limit = (body.get("spec") or {}).get("activeDeadlineSeconds")
    elapsed = seconds_since(status.get("startTime"))
    if limit is None or elapsed is None or elapsed <= float(limit):
        return False
    api: KubeAPI = memo.api
    changes = await stop_runtime(api, job, supervisor)
    generation = body["metadata"].get("generation")
    message = f"the job ran for {elapsed:.0f}s, past spec.activeDeadlineSeconds={limit}"
    conditions = set_condition(status.get("conditions"), "Running", "False", "DeadlineExceeded", message, generation)
    conditions = set_condition(conditions, "Failed", "True", "DeadlineExceeded", message, generation)
    patch.status["phase"] = "Failed"
    patch.status["conditions"] = conditions
    patch.status["completionTime"] = now()
    metrics.observe_phase(job.uid, "Failed")
    kopf.warn(dict(body), reason="DeadlineExceeded", message=f"phase {status.get('phase')} -> Failed: {message}")
    logger.info("%s: deadline exceeded (%s)", job.name, changes)
    return True
