"""The Knative backend's workers: one Knative Service `NAME-worker`, one request (= one rank's invocation) per pod."""
from __future__ import annotations

from mlless.contract import ENV_FUNCTION_TIMEOUT_SECONDS
from mlless_operator.builders.credentials import ca_mounts, ca_volumes, service_env
from mlless_operator.builders.jobref import JobRef, Manifest
from mlless_operator.builders.names import knative_service_name, labels, metadata
from mlless_operator.builders.podspec import container_security_context, pod_security_context
from mlless_operator.builders.runtime import TMP_VOLUME, common_env, function_resources, invoke_token_env, job_key_env, user_env

FUNCTION_PORT = 8080
#: What a Knative worker container runs: the HTTP function server that runs one rank per invocation.
FUNCTION_SERVER_COMMAND = ["mlless", "worker-server", "--port", str(FUNCTION_PORT)]

KNATIVE_SCALE_ANNOTATIONS = (
    "autoscaling.knative.dev/min-scale",
    "autoscaling.knative.dev/max-scale",
    "autoscaling.knative.dev/initial-scale",
)


def knative_scale_annotations(workers: int) -> dict[str, str]:
    """Pin the revision's pod count: Knative would otherwise scale queue-driven workers by HTTP traffic."""
    return {key: str(workers) for key in KNATIVE_SCALE_ANNOTATIONS}


def build_knative_service(job: JobRef) -> Manifest:
    """The workers as one Knative Service: one request (= one rank's invocation) per pod."""
    env = [
        *common_env(job),
        {"name": ENV_FUNCTION_TIMEOUT_SECONDS, "value": str(job.timeout_seconds)},
        invoke_token_env(job),
        job_key_env(job),
        *service_env(job),
        *user_env(job),
    ]
    return {
        "apiVersion": "serving.knative.dev/v1",
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
