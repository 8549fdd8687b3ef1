"""`JobRef`: the identity and spec of one TrainingJob, which every builder takes."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from mlless.spec.models import MODEL_TYPES, ModelType
from mlless.spec.schema import default
from mlless_operator.config import Config

Manifest = dict[str, Any]


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
        return int(self.spec.get("workers", default("workers")))

    @property
    def backoff_limit(self) -> int:
        """How many times a failed, evicted or deleted supervisor pod is recreated before the job fails."""
        return int(self.spec.get("backoffLimit", default("backoffLimit")))

    @property
    def suspended(self) -> bool:
        return bool(self.spec.get("suspend"))

    @property
    def function(self) -> Mapping[str, Any]:
        return self.spec.get("function") or {}

    @property
    def model_type(self) -> ModelType | None:
        """spec.model.type's registered type; None for a name this process has not registered (the CRD admits only
        the built-in ones, and the operator loads no plugins): the defaults of every model apply to it."""
        name = (self.spec.get("model") or {}).get("type")
        return MODEL_TYPES.named(name) if name in MODEL_TYPES else None

    @property
    def extra_image(self) -> str:
        """The operator's image for the package extra the model type needs (Config.extra_images); "" if none."""
        extra = self.model_type.extra if self.model_type is not None else None
        return dict(self.config.extra_images).get(extra, "") if extra else ""

    @property
    def image(self) -> str:
        """The supervisor's image: it builds the model too (to evaluate it), so it needs the model's extra."""
        return self.function.get("image") or self.extra_image or self.config.image

    @property
    def worker_image(self) -> str:
        return self.function.get("image") or self.extra_image or self.config.worker_image or self.config.image

    @property
    def timeout_seconds(self) -> int:
        return int(self.function.get("timeoutSeconds") or self.config.function_timeout_seconds)

    def external(self, service: str) -> Mapping[str, Any] | None:
        """spec.redis / spec.rabbitmq when it names an external instance, else None (managed)."""
        section = self.spec.get(service) or {}
        return section if section.get("url") else None
