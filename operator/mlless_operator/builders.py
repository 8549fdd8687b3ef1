"""Pure builders: each returns one manifest dict for a child of a TrainingJob.

Nothing here talks to the API server, so every object is unit-tested and
validated offline (`tests/operator/test_builders.py`). `JobRef` carries what
every builder needs about the job instead of a long parameter list.

Children of job NAME in namespace NS (the workers depend on the backend):

- Secret `NAME-credentials`: generated Redis and RabbitMQ passwords and the
  full service URLs; pods read them through `secretKeyRef`, never literally;
- ConfigMap `NAME-job`: the TrainingJob manifest the supervisor and worker
  pods read (MLLESS_JOB_FILE);
- Redis and RabbitMQ: StatefulSet + Service `NAME-redis` / `NAME-rabbitmq`
  (unless `spec.redis.url` / `spec.rabbitmq.url` names an external one);
- supervisor: ServiceAccount, Role, RoleBinding, Pod and metrics Service
  `NAME-supervisor`;
- workers: Pods `NAME-worker-RANK`, a Knative Service `NAME-worker`, or an
  OpenFaaS Function (and a Secret with the service URLs) in the OpenFaaS namespace.
"""
from __future__ import annotations

import base64
import copy
import hashlib
import json
import secrets
from dataclasses import dataclass
from typing import Any, Mapping

import yaml

from mlless.contract import (
    ANNOTATION_OWNER,
    ANNOTATION_OWNER_UID,
    API_VERSION,
    ENV_AMQP_URL,
    ENV_FUNCTION_TIMEOUT_SECONDS,
    ENV_INVOKE_TOKEN,
    ENV_JOB_FILE,
    ENV_JOB_ID,
    ENV_JOB_NAME,
    ENV_JOB_NAMESPACE,
    ENV_METRICS_PORT,
    ENV_RANK,
    ENV_REDIS_PASSWORD,
    ENV_REDIS_URL,
    ENV_SECRETS_DIR,
    ENV_WORKER_BACKEND,
    ENV_WORKER_URL,
    GROUP,
    KIND,
    LABEL_JOB,
    LABEL_RANK,
    LABEL_ROLE,
)
from mlless.transport.env import PASSWORD_VARS
from mlless_operator.config import Config

Manifest = dict[str, Any]


BACKENDS = ("knative", "openfaas", "pod")
DEFAULT_WORKERS = 3
DEFAULT_MEMORY = "2Gi"  # the papers' 2 GB functions
DEFAULT_CPU = "1"
RUNTIME_UID = 10001  # the mlless image's user
SERVICE_UID = 999  # the redis and rabbitmq images' own non-root user
METRICS_PORT = 9090
REDIS_PORT = 6379
AMQP_PORT = 5672
FUNCTION_PORT = 8080
RABBITMQ_USER = "mlless"
JOB_DIR = "/etc/mlless"
JOB_FILE = f"{JOB_DIR}/job.yaml"
#: What a Knative / OpenFaaS worker container runs: the HTTP function server that runs one rank per invocation.
FUNCTION_SERVER_COMMAND = ["mlless", "worker-server", "--port", str(FUNCTION_PORT)]
OPENFAAS_SECRETS_DIR = "/var/openfaas/secrets"

# Secret keys
REDIS_PASSWORD_KEY = "redis-password"
REDIS_URL_KEY = "redis-url"
RABBITMQ_USER_KEY = "rabbitmq-username"
RABBITMQ_PASSWORD_KEY = "rabbitmq-password"
AMQP_URL_KEY = "amqp-url"
#: What the OpenFaaS copy holds: the URLs only, never the bare passwords.
INVOKE_TOKEN_KEY = "invoke-token"
OPENFAAS_SECRET_KEYS = (REDIS_URL_KEY, AMQP_URL_KEY, INVOKE_TOKEN_KEY)


@dataclass(frozen=True)
class JobRef:
    """The identity and spec of one TrainingJob, plus the operator's config and the chosen backend."""

    name: str
    namespace: str
    uid: str
    spec: Mapping[str, Any]
    config: Config
    backend: str = "pod"

    @classmethod
    def from_body(cls, body: Mapping[str, Any], config: Config, backend: str = "pod") -> JobRef:
        meta = body["metadata"]
        spec = json.loads(json.dumps(dict(body.get("spec") or {})))  # a plain deep copy of Kopf's view
        return cls(name=meta["name"], namespace=meta["namespace"], uid=meta.get("uid", ""), spec=spec, config=config, backend=backend)

    @property
    def job_id(self) -> str:
        """Namespaces Redis keys and RabbitMQ queues; unique per cluster, so external services can be shared."""
        return f"{self.namespace}.{self.name}"

    @property
    def workers(self) -> int:
        return int(self.spec.get("workers", DEFAULT_WORKERS))

    @property
    def suspended(self) -> bool:
        return bool(self.spec.get("suspend"))

    @property
    def function(self) -> Mapping[str, Any]:
        return self.spec.get("function") or {}

    @property
    def image(self) -> str:
        return self.function.get("image") or self.config.image

    @property
    def timeout_seconds(self) -> int:
        return int(self.function.get("timeoutSeconds") or self.config.function_timeout_seconds)

    def external(self, service: str) -> Mapping[str, Any] | None:
        """spec.redis / spec.rabbitmq when it names an external instance, else None (managed)."""
        section = self.spec.get(service) or {}
        return section if section.get("url") else None


# ---- names and metadata --------------------------------------------------------------------------


def dns_name(*parts: str, limit: int = 63) -> str:
    """Join parts with '-'; if too long, truncate and add a short hash so names stay unique and valid."""
    name = "-".join(parts)
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


def child_name(job: JobRef, suffix: str) -> str:
    return dns_name(job.name, suffix)


def secret_name(job: JobRef) -> str:
    return child_name(job, "credentials")


def configmap_name(job: JobRef) -> str:
    return child_name(job, "job")


def redis_name(job: JobRef) -> str:
    return child_name(job, "redis")


def rabbitmq_name(job: JobRef) -> str:
    return child_name(job, "rabbitmq")


def supervisor_name(job: JobRef) -> str:
    return child_name(job, "supervisor")


def worker_pod_name(job: JobRef, rank: int) -> str:
    return dns_name(job.name, "worker", str(rank))


def knative_service_name(job: JobRef) -> str:
    return child_name(job, "worker")


def openfaas_function_name(job: JobRef) -> str:
    """Functions of every namespace share one OpenFaaS namespace, so the name carries the job's namespace."""
    return dns_name("mlless", job.namespace, job.name)


def openfaas_secret_name(job: JobRef) -> str:
    return dns_name(openfaas_function_name(job), "credentials")


def labels(job: JobRef, role: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "mlless",
        "app.kubernetes.io/instance": job.name,
        "app.kubernetes.io/component": role,
        "app.kubernetes.io/managed-by": "mlless-operator",
        LABEL_JOB: job.name,
        LABEL_ROLE: role,
    }


def selector_labels(job: JobRef, role: str) -> dict[str, str]:
    return {LABEL_JOB: job.name, LABEL_ROLE: role}


def worker_selector(job: JobRef) -> str:
    """The scale subresource's label selector (status.selector)."""
    return ",".join(f"{k}={v}" for k, v in selector_labels(job, "worker").items())


def owner_references(job: JobRef) -> list[Manifest]:
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": job.name,
            "uid": job.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def _metadata(job: JobRef, name: str, role: str, extra_labels: Mapping[str, str] | None = None) -> Manifest:
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": {**labels(job, role), **(extra_labels or {})},
        "ownerReferences": owner_references(job),
    }


# ---- security ------------------------------------------------------------------------------------


def pod_security_context(uid: int = RUNTIME_UID) -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(read_only_root: bool = True) -> Manifest:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": read_only_root,
        "capabilities": {"drop": ["ALL"]},
    }


# ---- credentials ---------------------------------------------------------------------------------


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def generate_credentials(job: JobRef) -> dict[str, str]:
    """Fresh passwords (URL-safe, so they can sit in a URL unescaped) for the managed services, and the token
    the supervisor invokes worker functions with (a Knative or OpenFaaS URL is reachable from the whole cluster)."""
    creds: dict[str, str] = {INVOKE_TOKEN_KEY: secrets.token_urlsafe(32)}
    if job.external("redis") is None:
        pw = secrets.token_urlsafe(24)
        creds[REDIS_PASSWORD_KEY] = pw
        creds[REDIS_URL_KEY] = f"redis://:{pw}@{redis_name(job)}.{job.namespace}.svc:{REDIS_PORT}/0"
    if job.external("rabbitmq") is None:
        pw = secrets.token_urlsafe(24)
        creds[RABBITMQ_USER_KEY] = RABBITMQ_USER
        creds[RABBITMQ_PASSWORD_KEY] = pw
        creds[AMQP_URL_KEY] = f"amqp://{RABBITMQ_USER}:{pw}@{rabbitmq_name(job)}.{job.namespace}.svc:{AMQP_PORT}/%2F"
    return creds


def build_secret(job: JobRef, credentials: Mapping[str, str] | None = None) -> Manifest:
    """The job's Secret. Create it once and never patch it: its passwords must stay what the services started with."""
    creds = generate_credentials(job) if credentials is None else credentials
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(job, secret_name(job), "credentials"),
        "type": "Opaque",
        "data": {k: _b64(v) for k, v in sorted(creds.items())},
    }


def build_openfaas_secret(job: JobRef, urls: Mapping[str, str]) -> Manifest:
    """The job's service URLs in the OpenFaaS namespace, where the Function mounts them.

    `urls` maps `redis-url` and `amqp-url` to the full URLs, passwords included
    (OpenFaaS has no secretKeyRef, so nothing can be assembled at start), and
    `invoke-token` to the job's invocation token. The
    Function sees each key as a file of that name under OPENFAAS_SECRETS_DIR.
    No owner reference can cross namespaces: the delete handler removes it.
    """
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": openfaas_secret_name(job),
            "namespace": job.config.openfaas_namespace,
            "labels": labels(job, "credentials"),
            "annotations": _cross_namespace_owner(job),
        },
        "type": "Opaque",
        "data": {k: _b64(v) for k, v in sorted(urls.items()) if k in OPENFAAS_SECRET_KEYS},
    }


def _cross_namespace_owner(job: JobRef) -> dict[str, str]:
    return {ANNOTATION_OWNER: f"{job.namespace}/{job.name}", ANNOTATION_OWNER_UID: job.uid}


def _secret_env(name: str, secret: str, key: str) -> Manifest:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def service_env(job: JobRef) -> list[Manifest]:
    """REDIS_URL and AMQP_URL for a runtime container: from the job Secret, or the external URL + its password Secret."""
    env: list[Manifest] = []
    for service, url_var, pw_var, url_key in (
        ("redis", ENV_REDIS_URL, PASSWORD_VARS[ENV_REDIS_URL], REDIS_URL_KEY),
        ("rabbitmq", ENV_AMQP_URL, PASSWORD_VARS[ENV_AMQP_URL], AMQP_URL_KEY),
    ):
        ext = job.external(service)
        if ext is None:
            env.append(_secret_env(url_var, secret_name(job), url_key))
        else:
            env.append({"name": url_var, "value": ext["url"]})
            if ext.get("passwordSecretRef"):
                # The runtime percent-encodes it into the URL (mlless.transport.env); `$(VAR)` would paste it raw.
                ref = ext["passwordSecretRef"]
                env.append(_secret_env(pw_var, ref["name"], ref["key"]))
    return env


# ---- the job file --------------------------------------------------------------------------------


def job_manifest(job: JobRef) -> Manifest:
    """The manifest the runtime reads (`mlless.spec.from_manifest` accepts and ignores the cluster fields)."""
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": job.name}, "spec": copy.deepcopy(dict(job.spec))}


def build_job_configmap(job: JobRef) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, configmap_name(job), "job"),
        "data": {"job.yaml": yaml.safe_dump(job_manifest(job), sort_keys=False)},
    }


# ---- Redis and RabbitMQ --------------------------------------------------------------------------


def _resources(section: Mapping[str, Any] | None, default: Manifest) -> Manifest:
    res = (section or {}).get("resources")
    return copy.deepcopy(dict(res)) if res else copy.deepcopy(default)


_SERVICE_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}


def _service(job: JobRef, name: str, role: str, port_name: str, port: int) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, name, role),
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
        "metadata": _metadata(job, name, role),
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


def build_redis_service(job: JobRef) -> Manifest:
    return _service(job, redis_name(job), "redis", "redis", REDIS_PORT)


def build_redis_statefulset(job: JobRef) -> Manifest:
    section = job.spec.get("redis") or {}
    persistent = bool(section.get("storage"))
    container = {
        "name": "redis",
        "image": section.get("image") or job.config.redis_image,
        "command": ["redis-server"],
        # $(REDIS_PASSWORD) is expanded by the kubelet from the Secret-backed env var: no literal password.
        "args": ["--requirepass", "$(REDIS_PASSWORD)", "--dir", "/data", "--appendonly", "yes" if persistent else "no", "--save", ""],
        "env": [_secret_env(ENV_REDIS_PASSWORD, secret_name(job), REDIS_PASSWORD_KEY)],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 20, "initialDelaySeconds": 10},
        "resources": _resources(section, _SERVICE_RESOURCES),
        "securityContext": container_security_context(read_only_root=True),
    }
    return _statefulset(job, redis_name(job), "redis", container, "/data", section)


def build_rabbitmq_service(job: JobRef) -> Manifest:
    return _service(job, rabbitmq_name(job), "rabbitmq", "amqp", AMQP_PORT)


def build_rabbitmq_statefulset(job: JobRef) -> Manifest:
    section = job.spec.get("rabbitmq") or {}
    container = {
        "name": "rabbitmq",
        "image": section.get("image") or job.config.rabbitmq_image,
        "env": [
            _secret_env("RABBITMQ_DEFAULT_USER", secret_name(job), RABBITMQ_USER_KEY),
            _secret_env("RABBITMQ_DEFAULT_PASS", secret_name(job), RABBITMQ_PASSWORD_KEY),
        ],
        "ports": [{"name": "amqp", "containerPort": AMQP_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": "amqp"}, "periodSeconds": 5, "initialDelaySeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "amqp"}, "periodSeconds": 30, "initialDelaySeconds": 30},
        "resources": _resources(section, _SERVICE_RESOURCES),
        # The image's entrypoint writes under /etc/rabbitmq at start, so the root filesystem stays writable.
        "securityContext": container_security_context(read_only_root=False),
    }
    return _statefulset(job, rabbitmq_name(job), "rabbitmq", container, "/var/lib/rabbitmq", section)


# ---- the supervisor ------------------------------------------------------------------------------


def build_supervisor_service_account(job: JobRef) -> Manifest:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(job, supervisor_name(job), "supervisor")}


def build_supervisor_role(job: JobRef) -> Manifest:
    """Get and patch only this job's status and scale subresources, nothing else."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(job, supervisor_name(job), "supervisor"),
        "rules": [
            {
                "apiGroups": [GROUP],
                "resources": ["trainingjobs/status", "trainingjobs/scale"],
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
        "metadata": _metadata(job, name, "supervisor"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": job.namespace}],
    }


def worker_endpoint(job: JobRef) -> str:
    """Where the supervisor invokes workers; empty for pods (they connect to the supervisor themselves)."""
    if job.backend == "knative":
        return f"http://{knative_service_name(job)}.{job.namespace}.svc.cluster.local"
    if job.backend == "openfaas":
        return f"{job.config.openfaas_gateway.rstrip('/')}/function/{openfaas_function_name(job)}.{job.config.openfaas_namespace}"
    return ""


_JOB_VOLUME = {"name": "job", "mountPath": JOB_DIR, "readOnly": True}
_TMP_VOLUME = {"name": "tmp", "mountPath": "/tmp"}


def _runtime_volumes(job: JobRef, *extra: Manifest) -> list[Manifest]:
    return [{"name": "job", "configMap": {"name": configmap_name(job)}}, {"name": "tmp", "emptyDir": {}}, *extra]


def _common_env(job: JobRef) -> list[Manifest]:
    return [
        {"name": ENV_JOB_ID, "value": job.job_id},
        {"name": "HOME", "value": "/tmp"},
    ]


def _invoke_token_env(job: JobRef) -> Manifest:
    """MLLESS_INVOKE_TOKEN from the job Secret (optional: a Secret made by an operator before tokens has none)."""
    return {
        "name": ENV_INVOKE_TOKEN,
        "valueFrom": {"secretKeyRef": {"name": secret_name(job), "key": INVOKE_TOKEN_KEY, "optional": True}},
    }


def build_supervisor_pod(job: JobRef) -> Manifest:
    name = supervisor_name(job)
    env = [
        {"name": ENV_JOB_FILE, "value": JOB_FILE},
        *_common_env(job),
        {"name": ENV_JOB_NAME, "value": job.name},
        {"name": ENV_JOB_NAMESPACE, "value": job.namespace},
        {"name": ENV_METRICS_PORT, "value": str(METRICS_PORT)},
        {"name": ENV_WORKER_BACKEND, "value": job.backend},
        {"name": ENV_WORKER_URL, "value": worker_endpoint(job)},
        {"name": ENV_FUNCTION_TIMEOUT_SECONDS, "value": str(job.timeout_seconds)},
        {"name": "MPLCONFIGDIR", "value": "/tmp"},
        _invoke_token_env(job),
        *service_env(job),
        *_user_env(job),  # object-store credentials: the supervisor reads the dataset too, and writes output.uri
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(job, name, "supervisor"),
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
                    "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
                    "resources": _resources(job.spec.get("supervisor"), {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}),
                    "securityContext": container_security_context(),
                    "volumeMounts": [_JOB_VOLUME, _TMP_VOLUME, {"name": "run", "mountPath": "/var/lib/mlless"}],
                }
            ],
            "volumes": _runtime_volumes(job, {"name": "run", "emptyDir": {}}),
        },
    }


def build_supervisor_service(job: JobRef) -> Manifest:
    """Headless metrics Service of the supervisor pod (what a ServiceMonitor selects)."""
    svc = _service(job, supervisor_name(job), "supervisor", "metrics", METRICS_PORT)
    svc["spec"]["clusterIP"] = "None"
    return svc


# ---- workers -------------------------------------------------------------------------------------


def _function_resources(job: JobRef) -> Manifest:
    memory = job.function.get("memory") or DEFAULT_MEMORY
    cpu = job.function.get("cpu") or DEFAULT_CPU
    return {"requests": {"cpu": str(cpu), "memory": str(memory)}, "limits": {"memory": str(memory)}}


def _user_env(job: JobRef) -> list[Manifest]:
    return [copy.deepcopy(dict(e)) for e in job.function.get("env") or []]


def build_worker_pod(job: JobRef, rank: int) -> Manifest:
    """Worker `rank` as a plain Pod running `mlless worker` (the pod backend)."""
    env = [
        {"name": ENV_JOB_FILE, "value": JOB_FILE},
        *_common_env(job),
        {"name": ENV_RANK, "value": str(rank)},
        *service_env(job),
        *_user_env(job),
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(job, worker_pod_name(job, rank), "worker", {LABEL_RANK: str(rank)}),
        "spec": {
            "restartPolicy": "OnFailure",
            "automountServiceAccountToken": False,
            # On SIGTERM a worker publishes its replica and announces that it leaves; give it time.
            "terminationGracePeriodSeconds": 60,
            "securityContext": pod_security_context(),
            "containers": [
                {
                    "name": "worker",
                    "image": job.image,
                    "command": ["mlless", "worker"],
                    "env": env,
                    "resources": _function_resources(job),
                    "securityContext": container_security_context(),
                    "volumeMounts": [_JOB_VOLUME, _TMP_VOLUME],
                }
            ],
            "volumes": _runtime_volumes(job),
        },
    }


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
        *_common_env(job),
        {"name": ENV_FUNCTION_TIMEOUT_SECONDS, "value": str(job.timeout_seconds)},
        _invoke_token_env(job),
        *service_env(job),
        *_user_env(job),
    ]
    return {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": _metadata(job, knative_service_name(job), "worker"),
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
                            "image": job.image,
                            "command": FUNCTION_SERVER_COMMAND,
                            "ports": [{"containerPort": FUNCTION_PORT}],
                            "env": env,
                            "resources": _function_resources(job),
                            "securityContext": container_security_context(),
                            "volumeMounts": [_TMP_VOLUME],
                        }
                    ],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                },
            }
        },
    }


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
    resources = _function_resources(job)
    extra_env = {e["name"]: str(e.get("value", "")) for e in _user_env(job) if "value" in e}
    return {
        "apiVersion": "openfaas.com/v1",
        "kind": "Function",
        "metadata": {
            "name": name,
            "namespace": job.config.openfaas_namespace,
            "labels": labels(job, "worker"),
            "annotations": _cross_namespace_owner(job),
        },
        "spec": {
            "name": name,
            "image": job.image,
            "labels": {**openfaas_scale_labels(job.workers), **selector_labels(job, "worker")},
            "annotations": _cross_namespace_owner(job),
            "environment": {
                ENV_JOB_ID: job.job_id,
                ENV_FUNCTION_TIMEOUT_SECONDS: str(job.timeout_seconds),
                # OpenFaaS has no secretKeyRef: the service URLs are files under this directory.
                ENV_SECRETS_DIR: OPENFAAS_SECRETS_DIR,
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
