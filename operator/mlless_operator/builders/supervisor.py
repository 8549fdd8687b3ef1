"""The supervisor: ServiceAccount, Role and RoleBinding, its Pod, and its metrics Service, all `NAME-supervisor`."""
from __future__ import annotations

from mlless.contract import (
    ANNOTATION_SUPERVISOR_RESTART,
    ENV_FUNCTION_TIMEOUT_SECONDS,
    ENV_JOB_FILE,
    ENV_JOB_NAME,
    ENV_JOB_NAMESPACE,
    ENV_METRICS_PORT,
    ENV_WORKER_BACKEND,
    ENV_WORKER_INVOCATION,
    ENV_WORKER_URL,
    GROUP,
    PLURAL,
    SUPERVISOR_METRICS_PORT,
)
from mlless_operator.builders.credentials import SUPERVISOR_IDENTITY_KEY, ca_mounts, ca_volumes, service_env
from mlless_operator.builders.jobfile import JOB_FILE
from mlless_operator.builders.jobref import JobRef, Manifest
from mlless_operator.builders.names import metadata, supervisor_name
from mlless_operator.builders.podspec import container_security_context, pod_security_context, resources
from mlless_operator.builders.runtime import JOB_VOLUME, TMP_VOLUME, common_env, identity_env, invoke_token_env, runtime_volumes, user_env
from mlless_operator.builders.services import cluster_ip_service


def build_supervisor_service_account(job: JobRef) -> Manifest:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(job, supervisor_name(job), "supervisor")}


def build_supervisor_role(job: JobRef) -> Manifest:
    """Get and patch only this job's status and scale subresources, nothing else."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(job, supervisor_name(job), "supervisor"),
        "rules": [
            {
                "apiGroups": [GROUP],
                "resources": [f"{PLURAL}/status", f"{PLURAL}/scale"],
                "resourceNames": [job.name],
                "verbs": ["get", "patch"],
            }
        ],
    }


def build_supervisor_role_binding(job: JobRef) -> Manifest:
    name = supervisor_name(job)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(job, name, "supervisor"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": job.namespace}],
    }


def build_supervisor_pod(job: JobRef, invocation: str, worker_url: str, restart: int = 0) -> Manifest:
    """The supervisor pod, reaching its workers as the job's backend says (`invocation`, at `worker_url` if over HTTP;
    `mlless_operator.backends.supervisor_pod` asks it). `restart` counts the pods before it (spec.backoffLimit), and
    only its annotation differs: a successor runs with the same job id, Secret, Redis and RabbitMQ, and resumes the job
    from Redis by itself."""
    name = supervisor_name(job)
    env = [
        {"name": ENV_JOB_FILE, "value": JOB_FILE},
        *common_env(job),
        {"name": ENV_JOB_NAME, "value": job.name},
        {"name": ENV_JOB_NAMESPACE, "value": job.namespace},
        {"name": ENV_METRICS_PORT, "value": str(SUPERVISOR_METRICS_PORT)},
        {"name": ENV_WORKER_BACKEND, "value": job.backend},
        {"name": ENV_WORKER_INVOCATION, "value": invocation},
        {"name": ENV_WORKER_URL, "value": worker_url},
        {"name": ENV_FUNCTION_TIMEOUT_SECONDS, "value": str(job.timeout_seconds)},
        {"name": "MPLCONFIGDIR", "value": "/tmp"},
        invoke_token_env(job),
        identity_env(job, SUPERVISOR_IDENTITY_KEY),
        *service_env(job),
        *user_env(job),  # object-store credentials: the supervisor reads the dataset too, and writes output.uri
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**metadata(job, name, "supervisor"), "annotations": {ANNOTATION_SUPERVISOR_RESTART: str(restart)}},
        "spec": {
            "serviceAccountName": name,
            "restartPolicy": "Never",
            # On SIGTERM (activeDeadlineSeconds, or a suspension past its grace period) the supervisor ends the job
            # cleanly: workers publish their replicas, the model is saved. Give it the time a worker gets.
            "terminationGracePeriodSeconds": 60,
            "securityContext": pod_security_context(),
            "containers": [
                {
                    "name": "supervisor",
                    "image": job.image,
                    "command": ["mlless", "supervisor", "--out", "/var/lib/mlless/run"],
                    "env": env,
                    "ports": [{"name": "metrics", "containerPort": SUPERVISOR_METRICS_PORT, "protocol": "TCP"}],
                    "resources": resources(job.spec.get("supervisor"), {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}),
                    "securityContext": container_security_context(),
                    "volumeMounts": [JOB_VOLUME, TMP_VOLUME, {"name": "run", "mountPath": "/var/lib/mlless"}, *ca_mounts(job)],
                }
            ],
            "volumes": runtime_volumes(job, {"name": "run", "emptyDir": {}}, *ca_volumes(job)),
        },
    }


def build_supervisor_service(job: JobRef) -> Manifest:
    """Headless metrics Service of the supervisor pod (what a ServiceMonitor selects)."""
    svc = cluster_ip_service(job, supervisor_name(job), "supervisor", "metrics", SUPERVISOR_METRICS_PORT)
    svc["spec"]["clusterIP"] = "None"
    return svc
