"""Delete: remove what owner-reference garbage collection cannot reach.

Everything in the job's namespace carries an owner reference and goes with
the job. What its backend put elsewhere (the OpenFaaS Function and its Secret
copy, in the OpenFaaS namespace, where owner references are not allowed) the
backend deletes here (`Backend.cleanup`).
So are the job's keys on an external Redis: the supervisor deletes them when
a job ends, but a suspended job's checkpoint, or the keys of a job whose
supervisor never finished, would otherwise stay until their TTL. (An external
RabbitMQ needs nothing: the job's queues expire once unused.)
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from mlless.contract import ANNOTATION_BACKEND
from mlless.transport import TransportError
from mlless.transport.admin import delete_job_keys
from mlless_operator import metrics
from mlless_operator.backends import FALLBACK, get, known
from mlless_operator.builders.jobref import JobRef
from mlless_operator.config import Config
from mlless_operator.kubeapi import KubeAPI
from mlless_operator.reconcile.service_urls import external_ca, external_url


async def cleanup(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter, **_: Any) -> None:
    config: Config = memo.config
    api: KubeAPI = memo.api
    backend = (body["metadata"].get("annotations") or {}).get(ANNOTATION_BACKEND)
    job = JobRef.from_body(body, config, backend or FALLBACK)
    if known(backend):  # (none recorded: the job never got children)
        await get(backend).cleanup(api, job, logger)
    if job.external("redis") is not None:
        await delete_external_keys(api, job, logger)
    metrics.forget(job.uid)


async def delete_external_keys(api: KubeAPI, job: JobRef, logger: logging.Logger | logging.LoggerAdapter) -> None:
    """Best effort: a Redis the operator cannot reach keeps the keys until their TTL, which must not block deletion."""
    try:
        url, ca = await external_url(api, job, "redis"), await external_ca(api, job, "redis")
        deleted = await asyncio.to_thread(delete_job_keys, url, job.job_id, ca=ca)
    except (kopf.TemporaryError, TransportError) as exc:
        logger.warning("%s: the job's keys stay on the external Redis until their TTL: %s", job.name, exc)
        return
    logger.info("deleted %d keys of %s from the external Redis", deleted, job.job_id)
