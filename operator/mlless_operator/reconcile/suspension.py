"""spec.suspend: checkpoint and stop the runtime, keep the state; unset it to resume from the checkpoint.

Suspend (spec.suspend: true):
1. Condition Suspended=True, reason Suspending, and an event. The supervisor
   sees spec.suspend in its own poll of the job, checkpoints the model to
   Redis, writes status.checkpointStep and exits 0.
2. Once the supervisor pod has terminated, or `suspend_grace_seconds` after
   step 1 if it has not, the supervisor pod is deleted and the workers stop
   (`reconcile.teardown`). Secret, ConfigMap, Redis and RabbitMQ stay: the
   checkpoint is in Redis. Phase Suspended, Running=False, and startTime is
   cleared: as for a Kubernetes Job, activeDeadlineSeconds counts from the
   next start, not across the suspension.
A suspension that has begun is carried through even if spec.suspend is unset
meanwhile: the supervisor may already be checkpointing, and only a completed
suspension tells its exit 0 apart from the end of training.

Resume (spec.suspend false or unset, phase Suspended): Suspended=False, reason
Resumed, an event; the supervisor pod and the workers are created as for a new
job (ranks 0..N-1, the job file refreshed from the spec), phase Pending. The
supervisor resumes from the Redis checkpoint by itself.

All of this runs from the status timer, level-triggered, and not from a
spec.suspend field handler: Kopf runs timers concurrently with change handlers,
and phase and conditions (one list in a merge patch) need a single writer.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

import kopf

from mlless.contract import ANNOTATION_BACKEND
from mlless_operator import metrics
from mlless_operator.builders.jobref import JobRef
from mlless_operator.builders.names import supervisor_name
from mlless_operator.conditions import FINISHED_POD_PHASES, get_condition, is_true, seconds_since, set_condition
from mlless_operator.config import Config
from mlless_operator.kubeapi import KubeAPI
from mlless_operator.reconcile.children import ensure_children
from mlless_operator.reconcile.replicas import remember_highest_rank
from mlless_operator.reconcile.teardown import stop_runtime


def wants_suspension(body: Mapping[str, Any]) -> bool:
    return bool((body.get("spec") or {}).get("suspend"))


def owns_runtime(body: Mapping[str, Any]) -> bool:
    """True while suspension, not creation or scaling, starts and stops the supervisor and workers:
    spec.suspend is set, or the job is suspending or suspended."""
    status = body.get("status") or {}
    return wants_suspension(body) or status.get("phase") == "Suspended" or is_true(status, "Suspended")


async def reconcile_suspension(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter) -> bool:
    """Take suspension or resumption one step further; True if the job is suspending, suspended or resuming
    (the caller then leaves the runtime alone), False if it is running normally."""
    status = dict(body.get("status") or {})
    suspended = status.get("phase") == "Suspended"
    if not suspended and (wants_suspension(body) or is_true(status, "Suspended")):
        await _suspend(body, status, patch, memo, logger)
        return True
    if suspended:
        if not wants_suspension(body):
            await _resume(body, status, patch, memo, logger)
        return True
    return False


def _job(body: Mapping[str, Any], config: Config) -> JobRef:
    return JobRef.from_body(body, config, body["metadata"]["annotations"][ANNOTATION_BACKEND])


async def _suspend(body: kopf.Body, status: dict[str, Any], patch: kopf.Patch, memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter) -> None:
    config: Config = memo.config
    api: KubeAPI = memo.api
    job = _job(body, config)
    generation = body["metadata"].get("generation")
    conditions = status.get("conditions")
    beginning = not is_true(status, "Suspended")
    if beginning:
        conditions = set_condition(conditions, "Suspended", "True", "Suspending",
                                   "spec.suspend: the supervisor checkpoints the model to Redis and exits", generation)
        waited = 0.0
    else:
        waited = seconds_since((get_condition(status, "Suspended") or {}).get("lastTransitionTime")) or 0.0

    pod = await api.get("v1", "Pod", job.namespace, supervisor_name(job))
    pod_phase = ((pod or {}).get("status") or {}).get("phase")
    exited = pod is None or pod_phase in FINISHED_POD_PHASES or bool(pod["metadata"].get("deletionTimestamp"))
    if not exited and waited < config.suspend_grace_seconds:
        if beginning:
            patch.status["conditions"] = conditions
            patch.status["observedGeneration"] = generation
            kopf.info(dict(body), reason="Suspending", message="spec.suspend is set: waiting for the supervisor to checkpoint and exit "
                      f"(at most {config.suspend_grace_seconds:g}s)")
            logger.info("%s: suspending", job.name)
        return

    changes = await stop_runtime(api, job, pod)
    step = status.get("checkpointStep")
    checkpoint = f"checkpoint of step {step}" if step is not None else "no checkpoint recorded"
    if exited and pod_phase != "Failed":
        event, message = kopf.info, f"{checkpoint}; supervisor and workers stopped, Redis and RabbitMQ kept"
    elif exited:
        event, message = kopf.warn, f"the supervisor failed while suspending ({checkpoint}); workers stopped, Redis and RabbitMQ kept"
    else:
        event, message = kopf.warn, (f"the supervisor did not exit within {config.suspend_grace_seconds:g}s of spec.suspend and was "
                                     f"deleted ({checkpoint}); workers stopped, Redis and RabbitMQ kept")
    conditions = set_condition(conditions, "Suspended", "True", "Suspended", message, generation)
    conditions = set_condition(conditions, "Running", "False", "Suspended", "the job is suspended", generation)
    patch.status["phase"] = "Suspended"
    patch.status["conditions"] = conditions
    patch.status["observedGeneration"] = generation
    patch.status["startTime"] = None  # the next start sets it anew
    metrics.observe_phase(job.uid, "Suspended")
    if beginning:
        kopf.info(dict(body), reason="Suspending", message="spec.suspend is set")
    event(dict(body), reason="Suspended", message=f"phase {status.get('phase')} -> Suspended: {message}")
    logger.info("%s: suspended (%s)", job.name, changes)


async def _resume(body: kopf.Body, status: dict[str, Any], patch: kopf.Patch, memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter) -> None:
    config: Config = memo.config
    api: KubeAPI = memo.api
    job = _job(body, config)
    pod = await api.get("v1", "Pod", job.namespace, supervisor_name(job))
    if pod is not None and ((pod.get("status") or {}).get("phase") in FINISHED_POD_PHASES):
        # The suspended session's supervisor, still there: it must go before the new one can take its name.
        await api.delete("v1", "Pod", job.namespace, supervisor_name(job), uid=pod["metadata"].get("uid"))
        raise kopf.TemporaryError("the suspended supervisor pod is being deleted", delay=2)
    # (A pending or running one was created by an earlier attempt of this resume; ensure_children keeps it.)
    ensured = await ensure_children(api, job, "start", status)  # status: the successor keeps the restart count
    generation = body["metadata"].get("generation")
    step = status.get("checkpointStep")
    message = f"resuming from the checkpoint of step {step}" if step is not None else "resuming; no checkpoint was recorded"
    conditions = set_condition(status.get("conditions"), "Suspended", "False", "Resumed", message, generation)
    remember_highest_rank(patch, ensured.highest_rank)
    patch.status["phase"] = "Pending"
    patch.status["conditions"] = conditions
    patch.status["observedGeneration"] = generation
    metrics.observe_phase(job.uid, "Pending")
    kopf.info(dict(body), reason="Resumed", message=f"phase Suspended -> Pending: {message}")
    logger.info("%s: resumed: %s", job.name, ensured.results)
