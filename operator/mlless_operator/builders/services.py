"""Redis and RabbitMQ: a StatefulSet and a Service each (not built when spec.redis / spec.rabbitmq is external); one
of each per shard of a sharded Redis (`spec.redis.shards`, names.redis_shards)."""
from __future__ import annotations

from typing import Any, Mapping

from mlless.contract import ENV_REDIS_PASSWORD
from mlless_operator.builders.credentials import (
    RABBITMQ_PASSWORD_KEY,
    RABBITMQ_USER_KEY,
    REDIS_PASSWORD_KEY,
    secret_env,
)
from mlless_operator.builders.jobref import JobRef, Manifest
from mlless_operator.builders.names import AMQP_PORT, REDIS_PORT, labels, metadata, rabbitmq_name, redis_shards, secret_name, selector_labels
from mlless_operator.builders.podspec import SERVICE_UID, container_security_context, pod_security_context, resources

_SERVICE_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}


def cluster_ip_service(job: JobRef, name: str, role: str, port_name: str, port: int) -> Manifest:
    """A ClusterIP Service in front of the pods of `role`, on one named port."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(job, name, role),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(job, role),
            "ports": [{"name": port_name, "port": port, "targetPort": port_name, "protocol": "TCP"}],
        },
    }


def _statefulset(job: JobRef, name: str, role: str, container: Manifest, data_path: str, section: Mapping[str, Any]) -> Manifest:
    storage = section.get("storage")
    container = {**container, "volumeMounts": [{"name": "data", "mountPath": data_path}, {"name": "tmp", "mountPath": "/tmp"}]}
    volumes: list[Manifest] = [{"name": "tmp", "emptyDir": {}}]
    if not storage:
        volumes.insert(0, {"name": "data", "emptyDir": {}})
    sts: Manifest = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(job, name, role),
        "spec": {
            "serviceName": name,
            "replicas": 1,
            "selector": {"matchLabels": selector_labels(job, role)},
            "template": {
                "metadata": {"labels": labels(job, role)},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security_context(SERVICE_UID),
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }
    if storage:
        sts["spec"]["volumeClaimTemplates"] = [
            {
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": storage}}},
            }
        ]
    return sts


def build_redis_service(job: JobRef, shard: int = 0) -> Manifest:
    name, role = redis_shards(job)[shard]
    return cluster_ip_service(job, name, role, "redis", REDIS_PORT)


def build_redis_statefulset(job: JobRef, shard: int = 0) -> Manifest:
    """Shard `shard` of the job's Redis; every shard has the job's one Redis password."""
    name, role = redis_shards(job)[shard]
    section = job.spec.get("redis") or {}
    persistent = bool(section.get("storage"))
    container = {
        "name": "redis",
        "image": section.get("image") or job.config.redis_image,
        "command": ["redis-server"],
        # $(REDIS_PASSWORD) is expanded by the kubelet from the Secret-backed env var: no literal password.
        "args": ["--requirepass", "$(REDIS_PASSWORD)", "--dir", "/data", "--appendonly", "yes" if persistent else "no", "--save", ""],
        "env": [secret_env(ENV_REDIS_PASSWORD, secret_name(job), REDIS_PASSWORD_KEY)],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 20, "initialDelaySeconds": 10},
        "resources": resources(section, _SERVICE_RESOURCES),
        "securityContext": container_security_context(read_only_root=True),
    }
    return _statefulset(job, name, role, container, "/data", section)


def build_rabbitmq_service(job: JobRef) -> Manifest:
    return cluster_ip_service(job, rabbitmq_name(job), "rabbitmq", "amqp", AMQP_PORT)


def build_rabbitmq_statefulset(job: JobRef) -> Manifest:
    section = job.spec.get("rabbitmq") or {}
    container = {
        "name": "rabbitmq",
        "image": section.get("image") or job.config.rabbitmq_image,
        "env": [
            secret_env("RABBITMQ_DEFAULT_USER", secret_name(job), RABBITMQ_USER_KEY),
            secret_env("RABBITMQ_DEFAULT_PASS", secret_name(job), RABBITMQ_PASSWORD_KEY),
        ],
        "ports": [{"name": "amqp", "containerPort": AMQP_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": "amqp"}, "periodSeconds": 5, "initialDelaySeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "amqp"}, "periodSeconds": 30, "initialDelaySeconds": 30},
        "resources": resources(section, _SERVICE_RESOURCES),
        # The image's entrypoint writes under /etc/rabbitmq at start, so the root filesystem stays writable.
        "securityContext": container_security_context(read_only_root=False),
    }
    return _statefulset(job, rabbitmq_name(job), "rabbitmq", container, "/var/lib/rabbitmq", section)
