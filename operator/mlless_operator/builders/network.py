"""NetworkPolicy `NAME-services`: the job's managed Redis (every shard) and RabbitMQ accept connections only from its own pods.

Allowed in: the job's supervisor and workers (by the job's labels; workers outside
the job's namespace, such as an OpenFaaS Function's, as their backend selects them)
and the operator's own pod (`Config.pod_namespace`, `Config.pod_labels`). The
passwords in the job's Secret still guard both services; this keeps every other
pod of the cluster from even reaching them. Not built when both are external.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from mlless.contract import LABEL_JOB, LABEL_ROLE
from mlless_operator.builders.jobref import JobRef, Manifest
from mlless_operator.builders.names import AMQP_PORT, REDIS_PORT, child_name, metadata, redis_shards
#: The label the API server puts on every namespace (Kubernetes 1.21+), holding its name.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def network_policy_name(job: JobRef) -> str:
    return child_name(job, "services")


def _roles(job: JobRef, *roles: str) -> Manifest:
    """A selector of the job's pods of these roles."""
    return {"matchLabels": {LABEL_JOB: job.name}, "matchExpressions": [{"key": LABEL_ROLE, "operator": "In", "values": list(roles)}]}


def _in_namespace(namespace: str, pods: Manifest) -> Manifest:
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}}, "podSelector": pods}


def build_network_policy(job: JobRef, foreign_pods: Iterable[tuple[str, Mapping[str, str]]] = ()) -> Manifest | None:
    """The policy, or None when neither Redis nor RabbitMQ is managed (nothing of the job's to guard).
    `foreign_pods`: (namespace, labels) of the job's workers outside its namespace (`Backend.foreign_pods`)."""
    managed = [(role, REDIS_PORT) for _, role in redis_shards(job)] if job.external("redis") is None else []
    managed += [("rabbitmq", AMQP_PORT)] if job.external("rabbitmq") is None else []
    if not managed:
        return None
    operator_pods: Manifest = {"matchLabels": dict(job.config.pod_labels)}
    peers: list[Manifest] = [
        {"podSelector": _roles(job, "supervisor", "worker")},
        # No namespace given: the operator runs in the job's namespace, where a bare podSelector looks.
        _in_namespace(job.config.pod_namespace, operator_pods) if job.config.pod_namespace else {"podSelector": operator_pods},
    ]
    peers += [_in_namespace(namespace, {"matchLabels": dict(pod_labels)}) for namespace, pod_labels in foreign_pods]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(job, network_policy_name(job), "network-policy"),
        "spec": {
            "podSelector": _roles(job, *(role for role, _ in managed)),
            "policyTypes": ["Ingress"],
            "ingress": [{"from": peers, "ports": [{"protocol": "TCP", "port": port} for port in dict.fromkeys(p for _, p in managed)]}],
        },
    }
