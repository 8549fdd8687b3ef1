"""A validated TrainingJob manifest as typed configuration.

`load_manifest` is the only way a manifest becomes a `TrainingJob`: it
validates against `schema.manifest_schema` and reports the first errors with
their field path, then fills defaults: the schema's, through the dataclasses
of `mlless.spec.config`, and the model-dependent optimizer defaults.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import jsonschema
import yaml

from mlless.spec.config import (
    KneeConfig,
    ModelConfig,
    OptimizerConfig,
    PricingConfig,
    StopConfig,
    SyncConfig,
    TunerConfig,
    default_optimizer,
    default_sync,
)
from mlless.spec.schema import DEFAULT_MAX_EPOCHS, DEFAULT_PATIENCE, default, manifest_schema


class SpecError(ValueError):
    """A manifest is invalid; the message names the field path."""


@dataclass(frozen=True)
class TrainingJob:
    name: str
    workers: int
    model: ModelConfig
    dataset_uri: str
    optimizer: OptimizerConfig
    seed: int = default("seed")
    cache_batches: bool = default("dataset.cacheBatches")
    sync: SyncConfig = field(default_factory=SyncConfig)
    stop: StopConfig = field(default_factory=StopConfig)
    evaluate_every: int = default("evaluation.everySteps")
    worker_timeout_seconds: float = default("liveness.workerTimeoutSeconds")
    supervisor_timeout_seconds: float = default("liveness.supervisorTimeoutSeconds")
    pricing: PricingConfig = field(default_factory=PricingConfig)
    autoscaler: TunerConfig = field(default_factory=TunerConfig)
    output_uri: str | None = None

    def to_json(self) -> str:
        """Serialise the resolved job for worker processes (plain JSON, never pickle)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TrainingJob:
        raw = json.loads(text)
        return cls(
            **{
                **raw,
                "model": ModelConfig(**raw["model"]),
                "optimizer": OptimizerConfig(**raw["optimizer"]),
                "sync": SyncConfig(**raw["sync"]),
                "stop": StopConfig(**raw["stop"]),
                "pricing": PricingConfig(**raw["pricing"]),
                "autoscaler": TunerConfig(**{**raw["autoscaler"], "knee": KneeConfig(**raw["autoscaler"]["knee"])}),
            }
        )


_STOP_FIELDS = {
    "targetLoss": "target_loss",
    "targetSteps": "target_steps",
    "maxSteps": "max_steps",
    "maxEpochs": "max_epochs",
    "maxSeconds": "max_seconds",
    "budgetUSD": "budget_usd",
    "patience": "patience",
}
_OPTIMIZER_FIELDS = {
    "type": "type",
    "learningRate": "learning_rate",
    "momentum": "momentum",
    "beta1": "beta1",
    "beta2": "beta2",
    "epsilon": "epsilon",
    "lrDecay": "lr_decay",
}
_PRICING_FIELDS = {
    "functionMemoryGB": "function_memory_gb",
    "pricePerGBSecond": "price_per_gb_second",
    "billingGranularitySeconds": "billing_granularity_seconds",
    "redisPerHour": "redis_per_hour",
    "rabbitmqPerHour": "rabbitmq_per_hour",
    "vmPerHour": "vm_per_hour",
}
_AUTOSCALER_FIELDS = {
    "enabled": "enabled",
    "intervalSeconds": "interval_seconds",
    "horizonSeconds": "horizon_seconds",
    "threshold": "threshold",
    "minWorkers": "min_workers",
}
_KNEE_FIELDS = {"method": "method", "span": "span", "slope": "slope", "stableChecks": "stable_checks"}
_SYNC_FIELDS = {"protocol": "protocol", "significanceThreshold": "significance_threshold", "slack": "slack"}
_MODEL_FIELDS = {"type": "type", "rank": "rank", "l2": "l2"}


def _renamed(section: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    return {names[k]: v for k, v in section.items() if k in names}


def _non_finite(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], float]]:
    """YAML's .nan and .inf: JSON (hence Kubernetes) has no such numbers, and NaN passes every schema bound."""
    if isinstance(node, float) and not math.isfinite(node):
        yield path, node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield from _non_finite(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _non_finite(value, (*path, index))


def validate_manifest(doc: Any, source: str = "manifest") -> None:
    """Raise SpecError naming the offending field paths."""
    validator = jsonschema.Draft4Validator(manifest_schema(strict=True))
    lines = [f"{'.'.join(map(str, path))}: {value} is not a finite number" for path, value in _non_finite(doc)]
    for err in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in err.absolute_path) or "(document)"
        lines.append(f"{path}: {err.message}")
    if lines:
        raise SpecError(f"{source}: invalid TrainingJob\n  " + "\n  ".join(lines[:5]))


def from_manifest(doc: Mapping[str, Any], base_dir: Path | None = None, source: str = "manifest") -> TrainingJob:
    """Validate a parsed manifest and resolve defaults."""
    validate_manifest(doc, source)
    spec = doc["spec"]
    model = ModelConfig(**_renamed(spec["model"], _MODEL_FIELDS))
    workers = spec.get("workers", default("workers"))
    optimizer = dataclasses.replace(default_optimizer(model.type, workers), **_renamed(spec.get("optimizer", {}), _OPTIMIZER_FIELDS))
    autoscaler = spec.get("autoscaler", {})
    stop = StopConfig(**_renamed(spec.get("stop", {}), _STOP_FIELDS))
    if not stop.has_length_limit():
        stop = dataclasses.replace(stop, max_epochs=DEFAULT_MAX_EPOCHS,
                                   patience=DEFAULT_PATIENCE if stop.patience is None else stop.patience)
    uri = _resolve(spec["dataset"]["uri"], base_dir)
    output_uri = spec.get("output", {}).get("uri")
    return TrainingJob(
        name=doc.get("metadata", {}).get("name", "trainingjob"),
        workers=workers,
        model=model,
        dataset_uri=uri,
        optimizer=optimizer,
        seed=spec.get("seed", default("seed")),
        cache_batches=spec["dataset"].get("cacheBatches", default("dataset.cacheBatches")),
        sync=dataclasses.replace(default_sync(model.type), **_renamed(spec.get("sync", {}), _SYNC_FIELDS)),
        stop=stop,
        evaluate_every=spec.get("evaluation", {}).get("everySteps", default("evaluation.everySteps")),
        worker_timeout_seconds=spec.get("liveness", {}).get("workerTimeoutSeconds", default("liveness.workerTimeoutSeconds")),
        supervisor_timeout_seconds=spec.get("liveness", {}).get("supervisorTimeoutSeconds",
                                                                default("liveness.supervisorTimeoutSeconds")),
        pricing=PricingConfig(**_renamed(spec.get("pricing", {}), _PRICING_FIELDS)),
        autoscaler=TunerConfig(
            **_renamed(autoscaler, _AUTOSCALER_FIELDS), knee=KneeConfig(**_renamed(autoscaler.get("knee", {}), _KNEE_FIELDS))
        ),
        output_uri=_resolve(output_uri, base_dir) if output_uri else None,
    )


def _resolve(uri: str, base_dir: Path | None) -> str:
    """Relative local paths resolve against the manifest's folder; URLs and absolute paths stay."""
    if base_dir is not None and "://" not in uri and not Path(uri).is_absolute():
        return str((base_dir / uri).resolve())
    return uri


def load_manifest(path: str | Path, overrides: Mapping[str, Any] | None = None) -> TrainingJob:
    """Read a TrainingJob YAML file (the same file `kubectl apply` takes); `overrides` replace top-level spec
    fields (the CLI's --workers) before validation, so they pass the same checks."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read manifest: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte {exc.start}): a manifest is YAML in UTF-8") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None
    if overrides and isinstance(doc, dict) and isinstance(doc.get("spec"), dict):
        doc["spec"] = {**doc["spec"], **overrides}
    return from_manifest(doc, base_dir=path.parent, source=str(path))
