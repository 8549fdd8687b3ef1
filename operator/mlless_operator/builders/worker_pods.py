"""The pod backend's workers: Pod `NAME-worker-RANK` running `mlless worker`, one per rank."""
from __future__ import annotations

from mlless.contract import ENV_JOB_FILE, ENV_RANK, LABEL_RANK
from mlless_operator.builders.credentials import ca_mounts, ca_volumes, service_env
from mlless_operator.builders.jobfile import JOB_FILE
from mlless_operator.builders.jobref import JobRef, Manifest
from mlless_operator.builders.names import metadata, worker_pod_name
from mlless_operator.builders.podspec import container_security_context, pod_security_context
from mlless_operator.builders.runtime import JOB_VOLUME, TMP_VOLUME, common_env, function_resources, job_key_env, runtime_volumes, user_env


def build_worker_pod(job: JobRef, rank: int) -> Manifest:
    """Worker `rank` as a plain Pod running `mlless worker` (the pod backend)."""
    env = [
        {"name": ENV_JOB_FILE, "value": JOB_FILE},
        *common_env(job),
        {"name": ENV_RANK, "value": str(rank)},
        job_key_env(job),
        *service_env(job),
        *user_env(job),
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(job, worker_pod_name(job, rank), "worker", {LABEL_RANK: str(rank)}),
        "spec": {
            "restartPolicy": "OnFailure",
            "automountServiceAccountToken": False,
            # On SIGTERM a worker publishes its replica and announces that it leaves; give it time.
            "terminationGracePeriodSeconds": 60,
            "securityContext": pod_security_context(),
            "containers": [
                {
                    "name": "worker",
                    "image": job.worker_image,
                    "command": ["mlless", "worker"],
                    "env": env,
                    "resources": function_resources(job),
                    "securityContext": container_security_context(),
                    "volumeMounts": [JOB_VOLUME, TMP_VOLUME, *ca_mounts(job)],
                }
            ],
            "volumes": runtime_volumes(job, *ca_volumes(job)),
        },
    }
