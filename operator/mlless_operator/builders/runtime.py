"""What the runtime's containers (the supervisor and the workers of every backend) have in common."""
from __future__ import annotations

import copy
import math
from typing import Any, Mapping

from kubernetes.utils import parse_quantity

from mlless.contract import ENV_CPU_CORES, ENV_IDENTITY, ENV_INVOKE_TOKEN, ENV_JOB_ID
from mlless.spec.models import FUNCTION_MEMORY
from mlless_operator.builders.credentials import INVOKE_TOKEN_KEY
from mlless_operator.builders.jobfile import JOB_DIR
from mlless_operator.builders.jobref import JobRef, Manifest
from mlless_operator.builders.names import configmap_name, secret_name

DEFAULT_CPU = "1"

JOB_VOLUME = {"name": "job", "mountPath": JOB_DIR, "readOnly": True}
TMP_VOLUME = {"name": "tmp", "mountPath": "/tmp"}


def runtime_volumes(job: JobRef, *extra: Manifest) -> list[Manifest]:
    """The job file's ConfigMap and a writable /tmp, for JOB_VOLUME and TMP_VOLUME to mount."""
    return [{"name": "job", "configMap": {"name": configmap_name(job)}}, {"name": "tmp", "emptyDir": {}}, *extra]


def common_env(job: JobRef) -> list[Manifest]:
    return [
        {"name": ENV_JOB_ID, "value": job.job_id},
        {"name": "HOME", "value": "/tmp"},
    ]


def _job_secret_env(job: JobRef, name: str, key: str) -> Manifest:
    """Env var `name` from `key` of the job Secret, optional: a Secret made by an older operator lacks the newer keys,
    and a job that runs an older image must still start its pods."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret_name(job), "key": key, "optional": True}}}


def invoke_token_env(job: JobRef) -> Manifest:
    """MLLESS_INVOKE_TOKEN from the job Secret (a Secret made before tokens has none: its functions accept anyone)."""
    return _job_secret_env(job, ENV_INVOKE_TOKEN, INVOKE_TOKEN_KEY)


def identity_env(job: JobRef, key: str) -> Manifest:
    """MLLESS_IDENTITY from entry `key` of the job Secret: a process's own identity, and only its own (a Secret made
    before identities has none: the runtime then refuses to start, in one line naming the variable)."""
    return _job_secret_env(job, ENV_IDENTITY, key)


def user_env(job: JobRef) -> list[Manifest]:
    """spec.function.env, as given."""
    return [copy.deepcopy(dict(e)) for e in job.function.get("env") or []]


def function_resources(job: JobRef) -> Manifest:
    """A worker's requests and limits, from spec.function (memory and cpu); memory defaults to the model type's
    (`ModelType.function_memory`: a network's functions are larger)."""
    memory = job.function.get("memory") or (job.model_type.function_memory if job.model_type else FUNCTION_MEMORY)
    cpu = job.function.get("cpu") or DEFAULT_CPU
    return {"requests": {"cpu": str(cpu), "memory": str(memory)}, "limits": {"memory": str(memory)}}


def function_cores(job: JobRef) -> int:
    """The worker's CPU request in whole cores, rounded up as the downward API's `requests.cpu` with divisor 1 would
    (at least 1). Given as a literal: Knative admits no resourceFieldRef by default and OpenFaaS no valueFrom."""
    return max(1, math.ceil(parse_quantity(str(function_resources(job)["requests"]["cpu"]))))


def quantity_errors(function: Mapping[str, Any]) -> list[str]:
    """One line for each of spec.function's cpu and memory that is not a Kubernetes quantity (`function_cores`
    reads the CPU; the API server would refuse either in a worker's resources)."""
    errors = []
    for key, example in (("cpu", "1, 500m, 2.5"), ("memory", "3Gi, 512Mi")):
        value = function.get(key)
        if value is None:
            continue
        try:
            parse_quantity(str(value))
        except ValueError:
            errors.append(f"spec.function.{key}: {value!r} is not a Kubernetes quantity (e.g. {example})")
    return errors


def cores_env(job: JobRef) -> Manifest:
    """ENV_CPU_CORES: the cores a worker computes on (a network's torch threads), its function's CPU request; on
    the node its affinity lists every core."""
    return {"name": ENV_CPU_CORES, "value": str(function_cores(job))}
