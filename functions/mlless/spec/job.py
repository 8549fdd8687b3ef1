"""A validated TrainingJob manifest as typed configuration.

`load_manifest` is the only way a manifest becomes a `TrainingJob`: it
validates against `schema.manifest_schema` and reports the first errors with
their field path, then fills defaults: the schema's, through the dataclasses
of `mlless.spec.config`, and the model-dependent optimizer defaults. A
manifest field sets the dataclass field of its snake_case name
(budgetUSD: budget_usd); TrainingJob's own scalar fields name their spec path.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Iterator, Mapping, get_type_hints

import jsonschema
import yaml

from mlless.spec.config import (
    ModelConfig,
    OptimizerConfig,
    PricingConfig,
    StopConfig,
    SyncConfig,
    TunerConfig,
    default_l2,
    default_optimizer,
    default_sync,
)
from mlless.contract import API_VERSION, KIND
from mlless.spec.schema import (
    DEFAULT_MAX_EPOCHS,
    default,
    manifest_schema,
    pairing_errors,
    schema_field,
)


class SpecError(ValueError):
    """A manifest is invalid; the message names the field path."""


def _spec_field(path: str) -> Any:
    """A TrainingJob field read from the spec field at dotted `path`, defaulting to that field's schema default."""
    return field(default=default(path), metadata={"spec": path})


@dataclass(frozen=True)
class TrainingJob:
    name: str
    workers: int
    model: ModelConfig
    dataset_uri: str
    optimizer: OptimizerConfig
    seed: int = _spec_field("seed")
    cache_batches: bool = _spec_field("dataset.cacheBatches")
    sync: SyncConfig = field(default_factory=SyncConfig)
    stop: StopConfig = field(default_factory=StopConfig)
    evaluate_every: int = _spec_field("evaluation.everySteps")
    worker_timeout_seconds: float = _spec_field("liveness.workerTimeoutSeconds")
    supervisor_timeout_seconds: float = _spec_field("liveness.supervisorTimeoutSeconds")
    pricing: PricingConfig = field(default_factory=PricingConfig)
    autoscaler: TunerConfig = field(default_factory=TunerConfig)
    output_uri: str | None = None

    def to_json(self) -> str:
        """Serialise the resolved job for worker processes (plain JSON, never pickle)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TrainingJob:
        """The job `to_json` wrote, held to the manifest's rules: a resolved job crosses a process boundary (a
        worker's job file, a function invocation), so a bad value is refused here, not found steps later."""
        job = cls(**_arguments(cls, json.loads(text), str))
        try:
            validate_manifest(job.to_manifest(), "resolved job")
        except SpecError as exc:
            raise SpecError("; ".join(line.strip() for line in str(exc).splitlines())) from None
        return job

    def to_manifest(self) -> dict[str, Any]:
        """The manifest this job resolves, defaults included: the inverse of `from_manifest` (its dataset and output
        URIs resolved, and without the fields the manifest derives, as the optimizer's weight decay)."""
        spec: dict[str, Any] = {"workers": self.workers, "dataset": {"uri": self.dataset_uri}}
        if self.output_uri is not None:
            spec["output"] = {"uri": self.output_uri}
        for section in ("model", "optimizer", "sync", "stop", "pricing", "autoscaler"):
            spec[section] = _section(getattr(self, section), schema_field(section))
        spec["model"] |= self.model.options
        for f in dataclasses.fields(self):
            if "spec" in f.metadata:
                *parents, leaf = f.metadata["spec"].split(".")
                node = spec
                for parent in parents:
                    node = node.setdefault(parent, {})
                node[leaf] = getattr(self, f.name)
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": self.name}, "spec": spec}


def _section(config: Any, schema: Mapping[str, Any]) -> dict[str, Any]:
    """The spec section that config dataclass `config` was read from (the inverse of `_arguments`), with each field
    the section's `schema` names and `config` sets."""
    section = {}
    for key, node in schema["properties"].items():
        value = getattr(config, _snake_case(key), None)
        if value is not None:
            section[key] = _section(value, node) if dataclasses.is_dataclass(value) else value
    return section


def _snake_case(name: str) -> str:
    """A manifest's camelCase field name as a dataclass field's, acronyms kept whole: budgetUSD -> budget_usd,
    pricePerGBSecond -> price_per_gb_second."""
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)).lower()


def _arguments(cls: type, section: Mapping[str, Any], field_name: Callable[[str], str] = _snake_case) -> dict[str, Any]:
    """The keyword arguments of dataclass `cls` given by `section`, whose keys are its fields' names after
    `field_name`; the mapping of a dataclass-typed field becomes that dataclass (autoscaler.knee). A `section` that
    is no mapping raises TypeError; a key that names no field is passed on, for `cls` to reject."""
    types = get_type_hints(cls)
    arguments = {}
    for key, value in {**section}.items():
        name = field_name(key)
        kind = types.get(name)
        arguments[name] = kind(**_arguments(kind, value, field_name)) if dataclasses.is_dataclass(kind) else value
    return arguments


def _given(spec: Mapping[str, Any], path: str) -> Iterator[Any]:
    """The value at a dotted spec path if the manifest gives one."""
    node: Any = spec
    for key in path.split("."):
        if key not in node:
            return
        node = node[key]
    yield node


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
    if not lines and isinstance(doc, Mapping):
        lines += pairing_errors(doc["spec"])
    if lines:
        raise SpecError(f"{source}: invalid TrainingJob\n  " + "\n  ".join(lines[:5]))


def from_manifest(doc: Mapping[str, Any], base_dir: Path | None = None, source: str = "manifest") -> TrainingJob:
    """Validate a parsed manifest and resolve defaults."""
    validate_manifest(doc, source)
    spec = doc["spec"]
    section = spec["model"]
    workers = spec.get("workers", default("workers"))
    stop = StopConfig(**_arguments(StopConfig, spec.get("stop", {})))
    given = _arguments(OptimizerConfig, spec.get("optimizer", {}))
    optimizer = default_optimizer(section["type"], workers, given.get("type"))
    # cosine's horizon is the epoch limit the manifest sets (validate_manifest refused cosine without one).
    cosine = given.get("lr_decay", optimizer.lr_decay) == "cosine"
    optimizer = dataclasses.replace(optimizer, **given, horizon_epochs=stop.max_epochs if cosine else None)
    init_from = section.get("initFrom")
    l2 = section.get("l2", default_l2(section["type"], optimizer.type))
    model = ModelConfig(section["type"], l2, init_from and resolve_uri(init_from, base_dir),
                        {k: v for k, v in section.items() if k not in ("type", "l2", "initFrom")})
    if not stop.has_length_limit():
        stop = dataclasses.replace(stop, max_epochs=DEFAULT_MAX_EPOCHS)
    output_uri = spec.get("output", {}).get("uri")
    return TrainingJob(
        name=doc.get("metadata", {}).get("name", "trainingjob"),
        workers=workers,
        model=model,
        dataset_uri=resolve_uri(spec["dataset"]["uri"], base_dir),
        optimizer=optimizer,
        sync=dataclasses.replace(default_sync(model.type), **_arguments(SyncConfig, spec.get("sync", {}))),
        stop=stop,
        pricing=PricingConfig(**_arguments(PricingConfig, spec.get("pricing", {}))),
        autoscaler=TunerConfig(**_arguments(TunerConfig, spec.get("autoscaler", {}))),
        output_uri=resolve_uri(output_uri, base_dir) if output_uri else None,
        **{f.name: value for f in dataclasses.fields(TrainingJob) if "spec" in f.metadata
           for value in _given(spec, f.metadata["spec"])},
    )


def resolve_uri(uri: str, base_dir: Path | None) -> str:
    """Relative local paths resolve against the manifest's folder; URLs and absolute paths stay."""
    if base_dir is not None and "://" not in uri and not Path(uri).is_absolute():
        return str((base_dir / uri).resolve())
    return uri


#: Aliases a manifest may use: a few, to repeat a section; a kilobyte of nested aliases expands to gigabytes.
MAX_ALIASES = 32


class _ManifestLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing what a TrainingJob never needs: many aliases, and keys given twice (YAML keeps
    the last one silently, so a setting could be overridden unnoticed)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise yaml.composer.ComposerError(None, None, f"more than {MAX_ALIASES} aliases",
                                                  self.peek_event().start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                break  # the safe loader refuses it, naming it
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_manifest(path: Path) -> Any:
    """The parsed YAML document of a manifest file; SpecError naming the file (and line) if it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read manifest: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte {exc.start}): a manifest is YAML in UTF-8") from None
    try:
        return yaml.load(text, Loader=_ManifestLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise SpecError(f"{path}: not valid YAML: {exc.problem or exc.context}{where}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None


def load_manifest(path: str | Path, overrides: Mapping[str, Any] | None = None) -> TrainingJob:
    """Read a TrainingJob YAML file (the same file `kubectl apply` takes); `overrides` replace top-level spec
    fields (the CLI's --workers) before validation, so they pass the same checks."""
    path = Path(path)
    doc = read_manifest(path)
    if overrides and isinstance(doc, dict) and isinstance(doc.get("spec"), dict):
        doc["spec"] = {**doc["spec"], **overrides}
    return from_manifest(doc, base_dir=path.parent, source=str(path))
