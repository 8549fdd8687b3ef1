"""Delete: remove what owner-reference garbage collection cannot reach.

Everything in the job's namespace carries an owner reference and goes with
the job. The OpenFaaS Function and its Secret copy live in the OpenFaaS
namespace, where owner references are not allowed, so they are deleted here.
(The job's Redis keys on an external Redis are not cleaned up here: the
supervisor deletes them at the end of a job and every key has a TTL.)
"""
from __future__ import annotations

import logging
from typing import Any

import kopf

from mlless_operator import builders as b
from mlless_operator import metrics
from mlless_operator.config import Config
from mlless_operator.kubeapi import KubeAPI


async def cleanup(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter, **_: Any) -> None:
    config: Config = memo.config
    api: KubeAPI = memo.api
    backend = (body["metadata"].get("annotations") or {}).get(b.ANNOTATION_BACKEND)
    job = b.JobRef.from_body(body, config, backend or "pod")
    if backend == "openfaas":
        ns = config.openfaas_namespace
        deleted = [
            name
            for kind, name in (("Function", b.openfaas_function_name(job)),)
            if await api.delete("openfaas.com/v1", kind, ns, name)
        ]
        if await api.delete("v1", "Secret", ns, b.openfaas_secret_name(job)):
            deleted.append(b.openfaas_secret_name(job))
        logger.info("deleted from %s: %s", ns, deleted or "nothing (already gone)")
    metrics.forget(job.uid)
