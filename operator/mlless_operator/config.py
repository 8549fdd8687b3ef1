"""Operator configuration from `MLLESS_OPERATOR_*` environment variables.

`load()` runs in the `@kopf.on.startup` handler (and once at import of
`main.py` for the few values that decorators need), so tests can set the
environment before the operator starts.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Mapping

from mlless.contract import ENV_OPERATOR_PREFIX, FUNCTION_TIMEOUT_SECONDS, GROUP
from mlless.spec.schema import choices



@dataclass(frozen=True)
class Config:
    #: Image of the supervisor and the workers when `spec.function.image` is not set.
    image: str = "ghcr.io/mlless/mlless:0.1.0"
    #: Image of the workers alone when `spec.function.image` is not set; empty means `image`. The Dockerfile's
    #: `worker` target fits here: it lacks only what the supervisor and the operator need (the kubernetes client).
    worker_image: str = ""
    #: Images of the supervisor and the workers of a job whose model type needs a package extra
    #: (`mlless.spec.models.ModelType.extra`: neural-net's torch), by extra (`extra=image,extra=image`), when
    #: `spec.function.image` is not set: the Dockerfile's targets built with that extra in EXTRAS. An extra not
    #: listed runs on `image` and `worker_image`, which must then hold it.
    extra_images: tuple[tuple[str, str], ...] = ()
    #: Image of a managed Redis when `spec.redis.image` is not set.
    redis_image: str = "redis:7.2-alpine"
    #: Image of a managed RabbitMQ when `spec.rabbitmq.image` is not set.
    rabbitmq_image: str = "rabbitmq:3.13-alpine"
    #: Namespaces to watch (comma-separated); empty means the whole cluster.
    namespaces: tuple[str, ...] = ()
    #: Namespace of OpenFaaS functions (the gateway's `functionNamespace`).
    openfaas_namespace: str = "openfaas-fn"
    #: OpenFaaS gateway URL the supervisor invokes functions through.
    openfaas_gateway: str = "http://gateway.openfaas:8080"
    #: Backend when `spec.function.backend` is unset: auto (knative, then openfaas, then pod), or a fixed one.
    default_backend: str = "auto"
    #: Default worker invocation time limit.
    function_timeout_seconds: int = FUNCTION_TIMEOUT_SECONDS
    #: How often the status timer follows the supervisor pod (phase, suspension, activeDeadlineSeconds).
    status_interval: float = 10.0
    #: How often finished jobs are checked against spec.ttlSecondsAfterFinished.
    ttl_interval: float = 15.0
    #: After spec.suspend, how long the supervisor may take to checkpoint and exit before its pod is deleted anyway.
    suspend_grace_seconds: float = 120.0
    #: Port of the operator's Prometheus /metrics; 0 disables the server (tests).
    metrics_port: int = 9100
    #: Prefix of Kopf's progress and diff-base annotations on TrainingJobs.
    annotations_prefix: str = f"operator.{GROUP}"
    #: Finalizer Kopf puts on TrainingJobs (it blocks deletion until the cleanup handler ran).
    finalizer: str = f"{GROUP}/finalizer"
    #: Give each job a NetworkPolicy: its managed Redis and RabbitMQ accept only its supervisor, its workers and the
    #: operator. Off for clusters without a policy controller (where it would do nothing).
    network_policy: bool = True
    #: The operator's own pod, which those policies let in: its namespace (empty: the job's own) and labels
    #: (`k=v,k=v`; the chart passes its Deployment's selector labels).
    pod_namespace: str = ""
    pod_labels: tuple[tuple[str, str], ...] = (("app.kubernetes.io/name", "mlless"), ("app.kubernetes.io/component", "operator"))

    def __post_init__(self) -> None:
        if self.default_backend not in ("auto", *choices("function.backend")):
            raise ValueError(f"{ENV_OPERATOR_PREFIX}DEFAULT_BACKEND: {self.default_backend!r} is not auto, knative, openfaas or pod")


_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _labels(raw: str) -> tuple[tuple[str, str], ...]:
    """`k=v,k=v` as pairs; a pair without `=` or with an empty key is an error."""
    pairs = []
    for item in (i.strip() for i in raw.split(",") if i.strip()):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(item)
        pairs.append((key.strip(), value.strip()))
    return tuple(pairs)


def load(env: Mapping[str, str] | None = None) -> Config:
    """Read every field from `MLLESS_OPERATOR_<FIELD>`; unset variables keep the defaults."""
    env = os.environ if env is None else env
    values: dict[str, object] = {}
    for f in dataclasses.fields(Config):
        raw = env.get(ENV_OPERATOR_PREFIX + f.name.upper())
        if raw is None:
            continue
        try:
            if f.name == "namespaces":
                values[f.name] = tuple(ns.strip() for ns in raw.split(",") if ns.strip())
            elif f.name in ("pod_labels", "extra_images"):
                values[f.name] = _labels(raw)
            elif f.type in ("bool", bool):
                values[f.name] = _BOOLS[raw.strip().lower()]
            elif f.type in ("int", int):
                values[f.name] = int(raw)
            elif f.type in ("float", float):
                values[f.name] = float(raw)
            else:
                values[f.name] = raw
        except (ValueError, KeyError):
            raise ValueError(f"{ENV_OPERATOR_PREFIX}{f.name.upper()}: cannot parse {raw!r}") from None
    return Config(**values)  # type: ignore[arg-type]
