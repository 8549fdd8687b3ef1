"""The Knative backend: one Knative Service `NAME-worker`, one request (= one rank's invocation) per pod."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from mlless.contract import ENV_FUNCTION_TIMEOUT_SECONDS, FUNCTION_PORT, WORKER_INVOCATION_HTTP
from mlless_operator.backends.base import Backend, Session, ensure_all, patch_scale
from mlless_operator.builders.credentials import WORKERS_IDENTITY_KEY, ca_mounts, ca_volumes, service_env
from mlless_operator.builders.jobref import JobRef, Manifest
from mlless_operator.builders.names import child_name, labels, metadata
from mlless_operator.builders.podspec import container_security_context, pod_security_context
from mlless_operator.builders.runtime import TMP_VOLUME, common_env, cores_env, function_resources, identity_env, invoke_token_env, user_env
from mlless_operator.kubeapi import KubeAPI

API_VERSION = "serving.knative.dev/v1"
#: What a Knative worker container runs: the HTTP function server that runs one rank per invocation.
FUNCTION_SERVER_COMMAND = ["mlless", "worker-server", "--port", str(FUNCTION_PORT)]

KNATIVE_SCALE_ANNOTATIONS = (
    "autoscaling.knative.dev/min-scale",
    "autoscaling.knative.dev/max-scale",
    "autoscaling.knative.dev/initial-scale",
)


def knative_service_name(job: JobRef) -> str:
    return child_name(job, "worker")


def knative_scale_annotations(workers: int) -> dict[str, str]:
    """Pin the revision's pod count: Knative would otherwise scale queue-driven workers by HTTP traffic."""
    return {key: str(workers) for key in KNATIVE_SCALE_ANNOTATIONS}


def build_knative_service(job: JobRef) -> Manifest:
    """The workers as one Knative Service: one request (= one rank's invocation) per pod."""
    env = [
        *common_env(job),
        {"name": ENV_FUNCTION_TIMEOUT_SECONDS, "value": str(job.timeout_seconds)},
        cores_env(job),
        invoke_token_env(job),
        identity_env(job, WORKERS_IDENTITY_KEY),  # any replica serves any rank: docs/kubernetes.md, "Security"
        *service_env(job),
        *user_env(job),
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": "Service",
        "metadata": metadata(job, knative_service_name(job), "worker"),
        "spec": {
            "template": {
                "metadata": {"labels": labels(job, "worker"), "annotations": knative_scale_annotations(job.workers)},
                "spec": {
                    "containerConcurrency": 1,
                    "timeoutSeconds": job.timeout_seconds,
                    "securityContext": pod_security_context(),
                    "containers": [
                        {
                            "name": "worker",
                            "image": job.worker_image,
                            "command": FUNCTION_SERVER_COMMAND,
                            "ports": [{"containerPort": FUNCTION_PORT}],
                            "env": env,
                            "resources": function_resources(job),
                            "securityContext": container_security_context(),
                            "volumeMounts": [TMP_VOLUME, *ca_mounts(job)],
                        }
                    ],
                    "volumes": [{"name": "tmp", "emptyDir": {}}, *ca_volumes(job)],
                },
            }
        },
    }


class KnativeBackend(Backend):
    name = "knative"
    invocation = WORKER_INVOCATION_HTTP
    requires = (API_VERSION, "services")

    def endpoint(self, job: JobRef) -> str:
        return f"http://{knative_service_name(job)}.{job.namespace}.svc.cluster.local"

    async def ensure_workers(self, api: KubeAPI, job: JobRef, session: Session, status: Mapping[str, Any],
                             highest_used: int) -> tuple[dict[str, str], int | None]:
        return await ensure_all(api, build_knative_service(job)), None

    async def scale(self, api: KubeAPI, job: JobRef, workers: int, removed: Iterable[int] = (), highest_used: int = -1,
                    missing_ok: bool = False) -> tuple[list[str], int | None]:
        body = {"spec": {"template": {"metadata": {"annotations": knative_scale_annotations(workers)}}}}
        return await patch_scale(api, API_VERSION, "Service", job.namespace, knative_service_name(job), body, workers, missing_ok), None
