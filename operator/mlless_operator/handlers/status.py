"""The status timer: the job's lifecycle, from the supervisor pod and the spec.

Each tick, in this order (the first that applies ends the tick):
1. suspension or resumption in progress (`reconcile.suspension`);
2. the supervisor pod's phase: Pending until it runs, then Running (startTime
   is set the first time), Succeeded or Failed;
3. spec.activeDeadlineSeconds (`reconcile.deadline`).
It is level-triggered, so a missed event or an operator restart only delays a
transition. It never writes what the supervisor owns (step, losses, cost,
workers, modelURI, removedRanks, checkpointStep).
"""
from __future__ import annotations

import logging
from typing import Any

import kopf

from mlless.contract import ANNOTATION_BACKEND, TERMINAL_JOB_PHASES
from mlless_operator import metrics
from mlless_operator.builders.jobref import BACKENDS, JobRef
from mlless_operator.builders.names import supervisor_name
from mlless_operator.conditions import get_condition, is_invalid, is_true, now, set_condition
from mlless_operator.kubeapi import KubeAPI
from mlless_operator.reconcile.deadline import enforce_deadline
from mlless_operator.reconcile.suspension import reconcile_suspension


def _termination(pod: dict[str, Any]) -> str:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or {}
        if term:
            return f"exit code {term.get('exitCode')}: {term.get('reason') or ''} {term.get('message') or ''}".strip()
    return (pod.get("status") or {}).get("message") or "the supervisor pod failed"


async def follow_supervisor(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter, **_: Any) -> None:
    status = dict(body.get("status") or {})
    meta = body["metadata"]
    phase = status.get("phase")
    backend = (meta.get("annotations") or {}).get(ANNOTATION_BACKEND)
    if phase in TERMINAL_JOB_PHASES or is_invalid(status) or backend not in BACKENDS:
        return
    if get_condition(status, "Created") is None:
        # The create handler's metadata patch (the backend) has landed but its status patch, a separate
        # request to the status subresource, has not: writing conditions now would drop Created.
        return
    if await reconcile_suspension(body, patch, memo, logger):
        return
    api: KubeAPI = memo.api
    job = JobRef.from_body(body, memo.config, backend)
    pod = await api.get("v1", "Pod", job.namespace, supervisor_name(job))
    pod_phase = ((pod or {}).get("status") or {}).get("phase")
    generation = meta.get("generation")
    conditions = status.get("conditions")
    if pod_phase == "Running" and (phase != "Running" or not is_true(status, "Running")):
        new_phase = "Running"
        conditions = set_condition(conditions, "Running", "True", "SupervisorRunning", "the supervisor pod is running", generation)
        if not status.get("startTime"):
            patch.status["startTime"] = now()  # activeDeadlineSeconds counts from here
    elif pod_phase == "Succeeded":
        new_phase = "Succeeded"
        conditions = set_condition(conditions, "Running", "False", "Completed", "training finished", generation)
        conditions = set_condition(conditions, "Succeeded", "True", "Completed", "the supervisor finished the job", generation)
    elif pod_phase == "Failed":
        new_phase = "Failed"
        message = _termination(pod or {})
        conditions = set_condition(conditions, "Running", "False", "SupervisorFailed", message, generation)
        conditions = set_condition(conditions, "Failed", "True", "SupervisorFailed", message, generation)
    else:
        await enforce_deadline(body, patch, memo, logger, job, pod)
        return
    patch.status["phase"] = new_phase
    patch.status["conditions"] = conditions
    if new_phase in TERMINAL_JOB_PHASES:
        patch.status["completionTime"] = now()
    metrics.observe_phase(job.uid, new_phase)
    if new_phase != phase:
        event = kopf.warn if new_phase == "Failed" else kopf.info
        event(dict(body), reason=new_phase, message=f"phase {phase} -> {new_phase}")
        logger.info("%s: phase %s -> %s", job.name, phase, new_phase)
