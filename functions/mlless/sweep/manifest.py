"""A validated TrainingSweep manifest: its template, its search space and the trials it makes.

`load_sweep` refuses a sweep before anything starts, with one line naming the field: a search space naming no
TrainingJob field, a value the TrainingJob's schema refuses (each grid and choice value and each range end is checked
by resolving the template with it), an empty range, a trial budget above the sweep's.
"""
from __future__ import annotations

import copy
import itertools
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import jsonschema

from mlless.plugins import load_plugins
from mlless.spec import SpecError, TrainingJob, from_manifest
from mlless.contract import API_VERSION, KIND, SWEEP_KIND
from mlless.spec.job import read_manifest, resolve_uri
from mlless.spec.schema import SPEC_SCHEMA
from mlless.spec.sweep import SAMPLERS, sweep_default, sweep_manifest_schema

#: The longest sweep name whose trials' names (NAME-N, N up to spec.maxTrials' maximum) are still Kubernetes names.
MAX_NAME = 63 - len("-10000")
RANDOM_SAMPLERS = ("choice", "uniform", "logUniform")


@dataclass(frozen=True)
class Parameter:
    field: str
    sampler: str  # one of SAMPLERS
    values: tuple[Any, ...] = ()  # grid, choice
    low: float = 0.0  # uniform, logUniform
    high: float = 0.0
    integer: bool = False  # the field is an integer: a drawn number is rounded

    def draw(self, rng: random.Random) -> Any:
        """A value of a random sampler."""
        if self.sampler == "choice":
            return rng.choice(self.values)
        if self.sampler == "uniform":
            value = rng.uniform(self.low, self.high)
        else:
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        return round(value) if self.integer else value

    def ends(self) -> tuple[Any, ...]:
        """The values that bound what this parameter can give: every listed value, or a range's two ends."""
        if self.values:
            return self.values
        return (round(self.low), round(self.high)) if self.integer else (self.low, self.high)


@dataclass(frozen=True)
class EarlyStopping:
    type: str
    resource: str  # steps or epochs
    min_resource: float
    reduction_factor: float

    @property
    def enabled(self) -> bool:
        return self.type == "asha"

    @property
    def field(self) -> str:
        """What counts the resource: the `step` or `epoch` of a metrics.jsonl row and of a TrainingJob's status."""
        return "step" if self.resource == "steps" else "epoch"


@dataclass(frozen=True)
class Sweep:
    name: str
    template: dict[str, Any]  # the template's TrainingJob spec
    parameters: tuple[Parameter, ...]
    max_trials: int
    max_concurrent: int
    budget_usd: float | None
    seed: int
    early_stopping: EarlyStopping
    output_uri: str | None
    base_dir: Path | None = None

    def assignments(self) -> list[dict[str, Any]]:
        """Each trial's field values, in trial order: the grid's product in turn, each with its random draws."""
        grid = [p for p in self.parameters if p.sampler == "grid"]
        points = list(itertools.product(*(p.values for p in grid)))
        rng = random.Random(self.seed)
        out = []
        for i in range(self.max_trials):
            values = dict(zip((p.field for p in grid), points[i % len(points)]))
            values |= {p.field: p.draw(rng) for p in self.parameters if p.sampler != "grid"}
            out.append({p.field: values[p.field] for p in self.parameters})
        return out

    def trial_name(self, index: int) -> str:
        return f"{self.name}-{index + 1}"

    def trial_manifest(self, name: str, values: Mapping[str, Any]) -> dict[str, Any]:
        """The TrainingJob manifest of a trial: the template with `values` set."""
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name},
                "spec": with_values(self.template, values)}

    def trial_job(self, name: str, values: Mapping[str, Any], source: str = "trial") -> TrainingJob:
        return from_manifest(self.trial_manifest(name, values), self.base_dir, source)

    def trial_limit(self, name: str, values: Mapping[str, Any]) -> float | None:
        """Where a trial's own stop rule ends it in the resource ASHA counts (maxSteps or maxEpochs), if it says."""
        stop = self.trial_job(name, values).stop
        return stop.max_steps if self.early_stopping.resource == "steps" else stop.max_epochs


def with_values(spec: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a TrainingJob `spec` with each dotted field of `values` set."""
    out = copy.deepcopy(dict(spec))
    for path, value in values.items():
        *parents, leaf = path.split(".")
        node = out
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return out


def _field_schema(path: str) -> dict[str, Any] | None:
    node: Any = SPEC_SCHEMA
    for name in path.split("."):
        node = node.get("properties", {}).get(name)
        if node is None:
            return None
    return node


def _refusal(exc: SpecError) -> str:
    """The first problem of a TrainingJob's SpecError, on one line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[1] if len(lines) > 1 else lines[0]


def _parameter(i: int, raw: Mapping[str, Any]) -> Parameter:
    where = f"spec.parameters[{i}]"
    path = raw["field"]
    node = _field_schema(path)
    if node is None:
        raise SpecError(f"{where}.field: {path} is not a TrainingJob spec field (see docs/reference.md)")
    if node.get("type") in ("object", "array") or "type" not in node:
        raise SpecError(f"{where}.field: {path} is a section of the TrainingJob spec, not a field of one value")
    given = [s for s in SAMPLERS if s in raw]
    if len(given) != 1:
        raise SpecError(f"{where}: give exactly one of {', '.join(SAMPLERS)} (given: {', '.join(given) or 'none'})")
    sampler = given[0]
    integer = node["type"] == "integer"
    if sampler in ("grid", "choice"):
        return Parameter(path, sampler, values=tuple(raw[sampler]), integer=integer)
    if node["type"] not in ("number", "integer"):
        raise SpecError(f"{where}.{sampler}: {path} is a {node['type']} field; give its values with grid or choice")
    low, high = raw[sampler]["min"], raw[sampler]["max"]
    if not low < high or (integer and round(low) == round(high)):
        raise SpecError(f"{where}.{sampler}: empty range: min {low} is not below max {high}")
    if sampler == "logUniform" and low <= 0:
        raise SpecError(f"{where}.logUniform.min: {low} must be above 0 for a log-uniform range")
    return Parameter(path, sampler, low=float(low), high=float(high), integer=integer)


def _check_values(sweep: Sweep, source: str) -> None:
    """Every value a trial can take, resolved into the template, passes the TrainingJob's checks. Each value is tried
    over the template alone, or, if the template needs the parameters (a required field set by one), over the
    template with every parameter at its first value."""
    name = sweep.trial_name(0)
    firsts = {p.field: p.ends()[0] for p in sweep.parameters}
    base: dict[str, Any] = {}
    try:
        sweep.trial_job(name, base, source)
    except SpecError:
        base = firsts
        try:
            sweep.trial_job(name, base, source)
        except SpecError as exc:
            raise SpecError(f"{source}: spec.template: {_refusal(exc)}") from None
    for i, p in enumerate(sweep.parameters):
        for j, value in enumerate(p.ends()):
            where = f"spec.parameters[{i}].{p.sampler}" + (f"[{j}]" if p.values else f".{('min', 'max')[j]}")
            try:
                job = sweep.trial_job(name, base | {p.field: value}, source)
            except SpecError as exc:
                raise SpecError(f"{source}: {where}: {value!r} is refused by the TrainingJob schema: "
                                f"{_refusal(exc)}") from None
            budget = job.stop.budget_usd
            if sweep.budget_usd is not None and budget is not None and budget > sweep.budget_usd:
                field = where if p.field == "stop.budgetUSD" else "spec.template.spec.stop.budgetUSD"
                raise SpecError(f"{source}: {field}: a trial budget of {budget:g} USD is larger than the sweep's "
                                f"spec.budgetUSD {sweep.budget_usd:g}")
    try:
        sweep.trial_job(name, firsts, source)
    except SpecError as exc:
        raise SpecError(f"{source}: spec.parameters: their first values together: {_refusal(exc)}") from None


def validate_sweep(doc: Any, source: str) -> None:
    """SpecError naming the first field the sweep's schema refuses."""
    validator = jsonschema.Draft4Validator(sweep_manifest_schema())
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path).lstrip(".")
        raise SpecError(f"{source}: {path or '(document)'}: {err.message}")


def sweep_from_manifest(doc: Any, base_dir: Path | None = None, source: str = "sweep") -> Sweep:
    load_plugins()  # the template may name what MLLESS_PLUGINS registers
    validate_sweep(doc, source)
    spec = doc["spec"]
    name = doc.get("metadata", {}).get("name", "sweep")
    if len(name) > MAX_NAME:
        raise SpecError(f"{source}: metadata.name: at most {MAX_NAME} characters (its trials are NAME-N)")
    try:
        parameters = tuple(_parameter(i, raw) for i, raw in enumerate(spec["parameters"]))
    except SpecError as exc:
        raise SpecError(f"{source}: {exc}") from None
    fields = [p.field for p in parameters]
    for i, path in enumerate(fields):
        if path in fields[:i]:
            raise SpecError(f"{source}: spec.parameters[{i}].field: {path} is varied by an earlier parameter too")
    drawn = any(p.sampler in RANDOM_SAMPLERS for p in parameters)
    if drawn and "maxTrials" not in spec:
        raise SpecError(f"{source}: spec.maxTrials: required when a parameter is drawn at random "
                        f"({', '.join(RANDOM_SAMPLERS)})")
    grid_size = math.prod(len(p.values) for p in parameters if p.sampler == "grid")
    stopping = spec.get("earlyStopping", {})
    sweep = Sweep(
        name=name,
        template=spec["template"]["spec"],
        parameters=parameters,
        max_trials=spec.get("maxTrials", grid_size),
        max_concurrent=spec.get("maxConcurrentTrials", sweep_default("maxConcurrentTrials")),
        budget_usd=spec.get("budgetUSD"),
        seed=spec.get("seed", sweep_default("seed")),
        early_stopping=EarlyStopping(*(stopping.get(key, sweep_default(f"earlyStopping.{key}"))
                                       for key in ("type", "resource", "minResource", "reductionFactor"))),
        output_uri=next((resolve_uri(uri, base_dir) for uri in [spec.get("output", {}).get("uri")] if uri), None),
        base_dir=base_dir,
    )
    _check_values(sweep, source)
    return sweep


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a TrainingSweep YAML file (the same file `kubectl apply` takes)."""
    path = Path(path)
    doc = read_manifest(path)
    if isinstance(doc, dict) and doc.get("kind") == KIND:
        raise SpecError(f"{path}: kind: a {KIND}; `mlless sweep` takes a {SWEEP_KIND} (`mlless train` runs this one)")
    return sweep_from_manifest(doc, path.parent, str(path))
