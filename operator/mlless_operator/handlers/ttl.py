"""spec.ttlSecondsAfterFinished: delete a Succeeded or Failed job that long after it finished.

Deleting the TrainingJob is all it takes: owner references take its children
with it, and the delete handler removes what they cannot reach.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

import kopf

from mlless.contract import API_VERSION, KIND, TERMINAL_JOB_PHASES
from mlless_operator.conditions import finished_at, seconds_since
from mlless_operator.kubeapi import KubeAPI


def applies(spec: Mapping[str, Any], status: Mapping[str, Any], **_: Any) -> bool:
    """Kopf `when=` filter: only finished jobs with a TTL get the timer."""
    return spec.get("ttlSecondsAfterFinished") is not None and status.get("phase") in TERMINAL_JOB_PHASES


async def expire(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter, **_: Any) -> None:
    meta = body["metadata"]
    ttl = (body.get("spec") or {}).get("ttlSecondsAfterFinished")
    ended = finished_at(body.get("status"))
    age = seconds_since(ended)
    if ttl is None or age is None or age < float(ttl) or meta.get("deletionTimestamp"):
        return
    api: KubeAPI = memo.api
    # The uid precondition: a job re-created under the same name is not this one.
    if await api.delete(API_VERSION, KIND, meta["namespace"], meta["name"], uid=meta.get("uid")):
        kopf.info(dict(body), reason="Expired", message=f"finished at {ended}; deleted after ttlSecondsAfterFinished={ttl}")
        logger.info("%s: deleted, %ss after it finished", meta["name"], ttl)
