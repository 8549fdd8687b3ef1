"""Phase from the supervisor pod: Pending until it runs, then Running, Succeeded or Failed.

(Step, loss, cost and the actual worker count are the supervisor's to mirror
into the status; this timer only follows the pod's lifecycle.)
"""
from __future__ import annotations

import logging
from typing import Any

import kopf

from mlless_operator import builders as b
from mlless_operator import metrics
from mlless_operator.kubeapi import KubeAPI
from mlless_operator.status import TERMINAL_PHASES, is_invalid, now, set_condition


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
    if phase in TERMINAL_PHASES or is_invalid(status) or b.ANNOTATION_BACKEND not in (meta.get("annotations") or {}):
        return
    api: KubeAPI = memo.api
    job = b.JobRef.from_body(body, memo.config)
    pod = await api.get("v1", "Pod", job.namespace, b.supervisor_name(job))
    if pod is None:
        return
    pod_phase = (pod.get("status") or {}).get("phase")
    generation = meta.get("generation")
    conditions = status.get("conditions")
    if pod_phase == "Running" and phase != "Running":
        new_phase = "Running"
        conditions = set_condition(conditions, "Running", "True", "SupervisorRunning", "the supervisor pod is running", generation)
    elif pod_phase == "Succeeded":
        new_phase = "Succeeded"
        conditions = set_condition(conditions, "Running", "False", "Completed", "training finished", generation)
        conditions = set_condition(conditions, "Succeeded", "True", "Completed", "the supervisor finished the job", generation)
    elif pod_phase == "Failed":
        new_phase = "Failed"
        message = _termination(pod)
        conditions = set_condition(conditions, "Running", "False", "SupervisorFailed", message, generation)
        conditions = set_condition(conditions, "Failed", "True", "SupervisorFailed", message, generation)
    else:
        return
    patch.status["phase"] = new_phase
    patch.status["conditions"] = conditions
    if new_phase in TERMINAL_PHASES:
        patch.status["completionTime"] = now()
    metrics.observe_phase(job.uid, new_phase)
    event = kopf.warn if new_phase == "Failed" else kopf.info
    event(dict(body), reason=new_phase, message=f"phase {phase} -> {new_phase}")
    logger.info("%s: phase %s -> %s", job.name, phase, new_phase)
