"""The OpenFaaS backend's workers: one Function `mlless-NS-NAME` in the OpenFaaS namespace (no owner reference can reach it)."""
from __future__ import annotations

from mlless.contract import CA_FILE_VARS, ENV_FUNCTION_TIMEOUT_SECONDS, ENV_JOB_ID, ENV_SECRETS_DIR
from mlless_operator.builders.credentials import CA_KEYS, ca_refs
from mlless_operator.builders.jobref import JobRef, Manifest
from mlless_operator.builders.names import cross_namespace_owner, labels, openfaas_function_name, openfaas_secret_name, selector_labels
from mlless_operator.builders.runtime import function_resources, user_env

OPENFAAS_SECRETS_DIR = "/var/openfaas/secrets"


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
        "apiVersion": "openfaas.com/v1",
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
