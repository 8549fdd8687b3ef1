"""The OpenFaaS backend: one Function `mlless-NS-NAME` in the OpenFaaS namespace, and a copy of the job's service URLs
and keys there as a Secret. No owner reference can reach that namespace, so the backend deletes both itself."""
from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping

import kopf

from mlless.contract import (
    ANNOTATION_OWNER,
    ANNOTATION_OWNER_UID,
    CA_FILE_VARS,
    ENV_CPU_CORES,
    ENV_FUNCTION_TIMEOUT_SECONDS,
    ENV_JOB_ID,
    ENV_SECRETS_DIR,
    WORKER_INVOCATION_HTTP,
)
from mlless_operator.backends.base import Backend, PodSelector, Session, ensure_all, patch_scale
from mlless_operator.builders.credentials import AMQP_URL_KEY, INVOKE_TOKEN_KEY, REDIS_URL_KEY, WORKERS_IDENTITY_KEY, b64, ca_refs
from mlless_operator.builders.jobref import JobRef, Manifest
from mlless_operator.builders.names import dns_name, labels, secret_name, selector_labels
from mlless_operator.builders.runtime import function_cores, function_resources, user_env
from mlless_operator.kubeapi import KubeAPI
from mlless_operator.reconcile.service_urls import external_url, referenced, secret_value

API_VERSION = "openfaas.com/v1"
OPENFAAS_SECRETS_DIR = "/var/openfaas/secrets"
#: The label faas-netes puts on the pods of an OpenFaaS Function (its name).
OPENFAAS_FUNCTION_LABEL = "faas_function"
#: An external service's CA bundle in the OpenFaaS copy, per service.
CA_KEYS = {"redis": "redis-ca", "rabbitmq": "rabbitmq-ca"}
#: What the OpenFaaS copy holds: the URLs only, never the bare passwords.
OPENFAAS_SECRET_KEYS = (REDIS_URL_KEY, AMQP_URL_KEY, INVOKE_TOKEN_KEY, WORKERS_IDENTITY_KEY, *CA_KEYS.values())


def openfaas_function_name(job: JobRef) -> str:
    """Functions of every namespace share one OpenFaaS namespace, so the name carries the job's namespace."""
    return dns_name("mlless", job.namespace, job.name)


def openfaas_secret_name(job: JobRef) -> str:
    return dns_name(openfaas_function_name(job), "credentials")


def cross_namespace_owner(job: JobRef) -> dict[str, str]:
    """The owner of a child in the OpenFaaS namespace, as annotations: no owner reference can cross namespaces."""
    return {ANNOTATION_OWNER: f"{job.namespace}/{job.name}", ANNOTATION_OWNER_UID: job.uid}


def openfaas_scale_labels(workers: int) -> dict[str, str]:
    """Pin the replica count; 0 (a suspended job) also allows scale-to-zero, which is otherwise off."""
    return {
        "com.openfaas.scale.min": str(workers),
        "com.openfaas.scale.max": str(workers),
        "com.openfaas.scale.zero": "true" if workers == 0 else "false",
    }


def build_openfaas_function(job: JobRef) -> Manifest:
    """The workers as one OpenFaaS Function in the OpenFaaS namespace (no owner reference can reach it)."""
    name = openfaas_function_name(job)
    timeout = f"{job.timeout_seconds}s"
    resources = function_resources(job)
    extra_env = {e["name"]: str(e.get("value", "")) for e in user_env(job) if "value" in e}
    return {
        "apiVersion": API_VERSION,
        "kind": "Function",
        "metadata": {
            "name": name,
            "namespace": job.config.openfaas_namespace,
            "labels": labels(job, "worker"),
            "annotations": cross_namespace_owner(job),
        },
        "spec": {
            "name": name,
            "image": job.worker_image,
            "labels": {**openfaas_scale_labels(job.workers), **selector_labels(job, "worker")},
            "annotations": cross_namespace_owner(job),
            "environment": {
                ENV_JOB_ID: job.job_id,
                ENV_FUNCTION_TIMEOUT_SECONDS: str(job.timeout_seconds),
                ENV_CPU_CORES: str(function_cores(job)),
                # OpenFaaS has no secretKeyRef: the service URLs, and CA bundles, are files under this directory.
                ENV_SECRETS_DIR: OPENFAAS_SECRETS_DIR,
                **{CA_FILE_VARS[service]: f"{OPENFAAS_SECRETS_DIR}/{CA_KEYS[service]}" for service, _ in ca_refs(job)},
                "HOME": "/tmp",
                "read_timeout": timeout,
                "write_timeout": timeout,
                "exec_timeout": timeout,
                # One invocation (one rank) per replica at a time. `mlless worker-server` enforces this itself
                # (429 when busy); max_inflight says the same to an OpenFaaS watchdog, should one front it.
                "max_inflight": "1",
                **extra_env,
            },
            "secrets": [openfaas_secret_name(job)],
            "limits": {"memory": resources["limits"]["memory"], "cpu": resources["requests"]["cpu"]},
            "requests": dict(resources["requests"]),
            "readOnlyRootFilesystem": True,
        },
    }


def build_openfaas_secret(job: JobRef, urls: Mapping[str, str]) -> Manifest:
    """The job's service URLs in the OpenFaaS namespace, where the Function mounts them.

    `urls` maps `redis-url` and `amqp-url` to the full URLs, passwords included
    (OpenFaaS has no secretKeyRef, so nothing can be assembled at start),
    `invoke-token` to the job's invocation token and `identity` to the identity its
    replicas share (any may be invoked as any rank: docs/kubernetes.md, "Security"). The
    Function sees each key as a file of that name under OPENFAAS_SECRETS_DIR.
    No owner reference can cross namespaces: `OpenFaaSBackend.cleanup` removes it.
    """
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": openfaas_secret_name(job),
            "namespace": job.config.openfaas_namespace,
            "labels": labels(job, "credentials"),
            "annotations": cross_namespace_owner(job),
        },
        "type": "Opaque",
        "data": {k: b64(v) for k, v in sorted(urls.items()) if k in OPENFAAS_SECRET_KEYS},
    }


async def openfaas_secrets(api: KubeAPI, job: JobRef) -> dict[str, str]:
    """What the OpenFaaS copy holds: the full Redis and AMQP URLs (managed ones from the job Secret, external ones
    with the password from their passwordSecretRef; OpenFaaS can only mount whole values, it cannot assemble a URL),
    external services' CA bundles, the invocation token and the workers' shared identity."""
    values: dict[str, str] = {}
    job_secret = await api.get("v1", "Secret", job.namespace, secret_name(job)) or {}
    for service, key in (("redis", REDIS_URL_KEY), ("rabbitmq", AMQP_URL_KEY)):
        if job.external(service) is not None:
            values[key] = await external_url(api, job, service)
            continue
        value = secret_value(job_secret, key)
        if value is None:
            raise kopf.TemporaryError(f"Secret {secret_name(job)} has no {key} yet", delay=5)
        values[key] = value
    for service, _ in ca_refs(job):
        values[CA_KEYS[service]] = await referenced(api, job, service, "caSecretRef")
    # A Secret made by an older operator lacks these: without a token its functions accept any caller, without an
    # identity they refuse to start.
    for key in (INVOKE_TOKEN_KEY, WORKERS_IDENTITY_KEY):
        value = secret_value(job_secret, key)
        if value is not None:
            values[key] = value
    return values


class OpenFaaSBackend(Backend):
    name = "openfaas"
    invocation = WORKER_INVOCATION_HTTP
    requires = (API_VERSION, "functions")

    def endpoint(self, job: JobRef) -> str:
        return f"{job.config.openfaas_gateway.rstrip('/')}/function/{openfaas_function_name(job)}.{job.config.openfaas_namespace}"

    async def ensure_workers(self, api: KubeAPI, job: JobRef, session: Session, status: Mapping[str, Any],
                             highest_used: int) -> tuple[dict[str, str], int | None]:
        secret = build_openfaas_secret(job, await openfaas_secrets(api, job))
        return await ensure_all(api, secret, build_openfaas_function(job)), None

    async def scale(self, api: KubeAPI, job: JobRef, workers: int, removed: Iterable[int] = (), highest_used: int = -1,
                    missing_ok: bool = False) -> tuple[list[str], int | None]:
        body = {"spec": {"labels": openfaas_scale_labels(workers)}}
        ns, name = job.config.openfaas_namespace, openfaas_function_name(job)
        return await patch_scale(api, API_VERSION, "Function", ns, name, body, workers, missing_ok), None

    async def cleanup(self, api: KubeAPI, job: JobRef, logger: logging.Logger | logging.LoggerAdapter) -> None:
        ns = job.config.openfaas_namespace
        deleted = [name for name in (openfaas_function_name(job),) if await api.delete(API_VERSION, "Function", ns, name)]
        if await api.delete("v1", "Secret", ns, openfaas_secret_name(job)):
            deleted.append(openfaas_secret_name(job))
        logger.info("deleted from %s: %s", ns, deleted or "nothing (already gone)")

    def foreign_pods(self, job: JobRef) -> list[PodSelector]:
        return [(job.config.openfaas_namespace, {OPENFAAS_FUNCTION_LABEL: openfaas_function_name(job)})]
