"""The status timer: the job's lifecycle, from the supervisor pod and the spec.

Each tick, in this order (the first of 2-5 that applies ends the tick):
1. PodsHealthy: whether any of the job's pods is stuck (`reconcile.pod_health`);
2. suspension or resumption in progress (`reconcile.suspension`);
3. a supervisor pod that failed or is missing: recreated while spec.backoffLimit
   allows (the job keeps its phase), else the job fails (`reconcile.restarts`);
4. the supervisor pod's phase: Pending until it runs, then Running (startTime
   is set the first time), or Succeeded;
5. spec.activeDeadlineSeconds (`reconcile.deadline`).
It is level-triggered, so a missed event or an operator restart only delays a
transition. It never writes what the supervisor owns (step, losses, cost,
workers, modelURI, removedRanks, checkpointStep).
"""
from __future__ import annotations

import logging
from typing import Any

import kopf

from mlless.contract import ANNOTATION_BACKEND, TERMINAL_JOB_PHASES
from mlless_operator import backends, metrics
from mlless_operator.builders.jobref import JobRef
from mlless_operator.builders.names import supervisor_name
from mlless_operator.conditions import get_condition, is_invalid, is_true, now, set_condition, supervisor_restarts
from mlless_operator.kubeapi import KubeAPI
from mlless_operator.reconcile.deadline import enforce_deadline
from mlless_operator.reconcile.pod_health import pods_healthy
from mlless_operator.reconcile.restarts import pod_restarts, replace_supervisor
from mlless_operator.reconcile.suspension import reconcile_suspension


async def follow_supervisor(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter, **_: Any) -> None:
    status = dict(body.get("status") or {})
    meta = body["metadata"]
    phase = status.get("phase")
    backend = (meta.get("annotations") or {}).get(ANNOTATION_BACKEND)
    if phase in TERMINAL_JOB_PHASES or is_invalid(status) or not backends.known(backend) or meta.get("deletionTimestamp"):
        return  # (a job being deleted: its pods may be going first, and must not be replaced)
    if get_condition(status, "Created") is None:
        # The create handler's metadata patch (the backend) has landed but its status patch, a separate
        # request to the status subresource, has not: writing conditions now would drop Created.
        return
    api: KubeAPI = memo.api
    job = JobRef.from_body(body, memo.config, backend)
    generation = meta.get("generation")
    # Read first: the nearer to the body's snapshot, the smaller the chance of pairing a supervisor that has
    # already seen a new spec (spec.suspend, and exited 0) with the old spec.
    pod = await api.get("v1", "Pod", job.namespace, supervisor_name(job))
    checked = await pods_healthy(api, job, status.get("conditions"), generation)
    if checked is not status.get("conditions"):
        # Written now, and read by whatever this tick writes next, so that no later patch of the list drops it.
        status["conditions"] = patch.status["conditions"] = checked
        body = {**body, "status": status}  # what the later steps read
    if await reconcile_suspension(body, patch, memo, logger):
        return
    pod_phase = ((pod or {}).get("status") or {}).get("phase")
    conditions = status.get("conditions")
    if pod is None or (pod_phase == "Failed" and not pod["metadata"].get("deletionTimestamp")):
        await _replace_supervisor(body, status, patch, api, job, pod, logger)
        return
    if pod_restarts(pod, status) != supervisor_restarts(status):
        patch.status["supervisorRestarts"] = pod_restarts(pod, status)  # a successor created by an interrupted tick
    if pod_phase == "Running" and (phase != "Running" or not is_true(status, "Running")):
        new_phase = "Running"
        conditions = set_condition(conditions, "Running", "True", "SupervisorRunning", "the supervisor pod is running", generation)
        if not status.get("startTime"):
            patch.status["startTime"] = now()  # activeDeadlineSeconds counts from here
    elif pod_phase == "Succeeded":
        new_phase = "Succeeded"
        conditions = set_condition(conditions, "Running", "False", "Completed", "training finished", generation)
        conditions = set_condition(conditions, "Succeeded", "True", "Completed", "the supervisor finished the job", generation)
    else:
        await enforce_deadline(body, patch, memo, logger, job, pod)
        return
    _transition(body, patch, job, new_phase, conditions, logger)


async def _replace_supervisor(body: Any, status: dict[str, Any], patch: kopf.Patch, api: KubeAPI, job: JobRef,
                              pod: dict[str, Any] | None, logger: logging.Logger | logging.LoggerAdapter) -> None:
    """A failed or missing supervisor: its successor, or the job's failure once spec.backoffLimit is used up."""
    generation = body["metadata"].get("generation")
    replaced = await replace_supervisor(api, job, pod, status)
    limit = job.backoff_limit
    if replaced.restarted:
        message = f"restart {replaced.restarts} of {limit}: {replaced.cause}"
        patch.status["supervisorRestarts"] = replaced.restarts
        patch.status["conditions"] = set_condition(status.get("conditions"), "SupervisorRestarted", "True", replaced.reason, message, generation)
        kopf.warn(dict(body), reason="SupervisorRestarted", message=message)
        logger.info("%s: supervisor %s", job.name, message)
        return
    used = f"after {replaced.restarts} restarts" if replaced.restarts else "and spec.backoffLimit allows no restart"
    message = f"{replaced.cause}; {used} (spec.backoffLimit={limit})"
    conditions = set_condition(status.get("conditions"), "Running", "False", "BackoffLimitExceeded", message, generation)
    conditions = set_condition(conditions, "Failed", "True", "BackoffLimitExceeded", message, generation)
    _transition(body, patch, job, "Failed", conditions, logger, message)


def _transition(body: Any, patch: kopf.Patch, job: JobRef, new_phase: str, conditions: list[Any] | None,
                logger: logging.Logger | logging.LoggerAdapter, detail: str = "") -> None:
    phase = (body.get("status") or {}).get("phase")
    patch.status["phase"] = new_phase
    patch.status["conditions"] = conditions
    if new_phase in TERMINAL_JOB_PHASES:
        patch.status["completionTime"] = now()
    metrics.observe_phase(job.uid, new_phase)
    if new_phase != phase:
        event = kopf.warn if new_phase == "Failed" else kopf.info
        event(dict(body), reason=new_phase, message=f"phase {phase} -> {new_phase}" + (f": {detail}" if detail else ""))
        logger.info("%s: phase %s -> %s", job.name, phase, new_phase)
