"""The one JSON schema of a TrainingJob.

The CLI validates manifests with it (`mlless.spec.load_manifest`) and the CRD's
`openAPIV3Schema` is generated from it (`mlless.spec.crd`), so a field exists
in exactly one place. It is written in OpenAPI 3.0's dialect, which the CLI
checks with JSON Schema draft 4 (the same boolean exclusive bounds), and kept
inside the Kubernetes structural-schema subset (every node typed, no
`additionalProperties` beside `properties`); the CLI adds
`additionalProperties: false` when validating so that a typo in a local
manifest is an error rather than silently ignored, as the API server would
prune it.
"""
from __future__ import annotations

import copy
from typing import Any, Iterable, Iterator

from mlless.contract import API_VERSION, KIND
from mlless.spec import models

Schema = dict[str, Any]


#: averaging's H. At P = 2 on the quick sets of benchmarks/time_to_quality.py (1M skewed ratings, 200k clicks; a
#: loaded 2-core machine, 3 runs each), H = 8, 16 and 32 reached the target within each other's noise; 8 sent twice
#: 16's bytes, and 32 needed up to twice 16's epochs on the ratings.
LOCAL_STEPS = 16
#: admm's ρ. On the 1M clicks of benchmarks/scaling.py (embedded, H = 16, one run each; RESULTS.md, "ADMM"),
#: ρ = 0.01 to 1 reached the target in the same epochs at P = 2 (2.7); at P = 3, 0.01 and 0.1 took 4.0 epochs and
#: 0.3 and 1 took 4.7; ρ = 10 took 4.0 and 7.4.
RHO = 0.1
#: Without a step, epoch or seconds limit, stop after this many evaluations without improvement...
DEFAULT_PATIENCE = 5
#: ...or, should the validation loss keep creeping down (or evaluation be off), after this many epochs.
DEFAULT_MAX_EPOCHS = 50.0


def shown(value: Any) -> str:
    """A value as the descriptions (and docs/reference.md) write it: true, 0.9, 1e-08, isp."""
    return str(value).lower() if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) else str(value)


def default_sentence(default: Any) -> str:
    """What a field's description ends with when the field has a default."""
    return f" Default {shown(default)}."


def _with_default(node: Schema, default: Any) -> Schema:
    """Record a field's default in the schema, the one place it is written, and say it in the description."""
    if default is not None:
        node["default"] = default
        node["description"] += default_sentence(default)
    return node


def _num(description: str, minimum: float | None = None, exclusive: bool = False, below: float | None = None,
         default: float | None = None) -> Schema:
    """A number >= minimum (> with `exclusive`) and, if given, strictly below `below`."""
    # OpenAPI 3.0 (and JSON Schema draft 4) spell exclusive bounds as booleans beside minimum/maximum.
    node: Schema = {"type": "number", "description": description}
    if minimum is not None:
        node["minimum"] = minimum
        if exclusive:
            node["exclusiveMinimum"] = True
    if below is not None:
        node["maximum"] = below
        node["exclusiveMaximum"] = True
    return _with_default(node, default)


#: The largest value of an integer field without a tighter bound: Kubernetes' int32 (a maxSteps of 1e26 used to be
#: accepted, and overflowed what was computed from it).
MAX_INT = 2**31 - 1


def _int(description: str, minimum: int | None = None, maximum: int = MAX_INT, default: int | None = None) -> Schema:
    node: Schema = {"type": "integer", "description": description, "maximum": maximum}
    if minimum is not None:
        node["minimum"] = minimum
    return _with_default(node, default)


def _bool(description: str, default: bool) -> Schema:
    return _with_default({"type": "boolean", "description": description}, default)


def _choice(description: str, values: list[str], default: str | None = None) -> Schema:
    return _with_default({"type": "string", "enum": values, "description": description}, default)


def _obj(description: str, properties: dict[str, Schema], required: list[str] | None = None) -> Schema:
    node: Schema = {"type": "object", "description": description, "properties": properties}
    if required:
        node["required"] = required
    return node


#: What a protocol needs of a model, as one of `ModelType.traits` (mlless.spec.models). `mlless validate` and
#: `mlless train` refuse a model without it (`pairing_errors`), and so does the API server, by the CEL rules
#: `cel_rules` puts in the spec's schema (CEL, which the CLI's JSON Schema validator ignores).
NEEDS: dict[str, str] = {
    # Blocks of users and items exist only in ratings data (runtime/sync/blocked.py).
    "blocked": "blocks",
    # Consensus ADMM needs a convex loss; PMF's is not (runtime/sync/admm.py).
    "admm": "convex",
}


def pairings(types: Iterable[models.ModelType]) -> Iterator[tuple[str, str, str, tuple[str, ...]]]:
    """(field, value, other field, its admitted values): each protocol of `NEEDS`, and the `types` it admits."""
    types = tuple(types)
    for protocol, trait in NEEDS.items():
        yield "sync.protocol", protocol, "model.type", tuple(t.name for t in types if trait in t.traits)


def _admitting(protocol: str) -> str:
    """The built-in model types `protocol` admits, for its description."""
    return ", ".join(t.name for t in models.BUILT_IN if NEEDS[protocol] in t.traits)


SPEC_SCHEMA: Schema = _obj(
    "Desired state of a serverless training job: one supervisor and `workers` worker functions.",
    {
        "workers": _int("Number of worker functions P (replicas).", 1, 1024, default=3),
        "seed": _int("Seed for model initialisation and mini-batch order.", 0, default=0),
        "model": _obj(
            "The model to train.",
            {
                "type": _choice("; ".join(f"{t.name}: {t.summary} ({t.loss_metric.upper()})" for t in models.BUILT_IN)
                                + ".", [t.name for t in models.BUILT_IN]),
                "rank": _int("Latent factors per user and item (pmf).", 1, 1024, default=20),
                "l2": _num("Weight decay applied to the parameters a mini-batch touches. Default per model.", 0),
            },
            ["type"],
        ),
        "dataset": _obj(
            "Mini-batches written by `mlless prepare`.",
            {
                "uri": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Directory or fsspec URL (s3://...) holding manifest.json; relative paths resolve against the manifest file's folder.",
                },
                "cacheBatches": _bool("Keep mini-batches in worker memory after the first read.", False),
            },
            ["uri"],
        ),
        "optimizer": _obj(
            "Optimizer applied by each worker to its local replica. Defaults depend on the model.",
            {
                "type": _choice("Update rule. adagrad updates per sample inside the mini-batch (LIBMF, Vowpal Wabbit); "
                                "normalized too, with each feature's step scaled by the largest value it has taken "
                                "(Vowpal Wabbit's default; the linear models only); the others take one step per "
                                "mini-batch.", ["adagrad", "normalized", "sgd", "momentum", "nesterov", "adam"]),
                "learningRate": _num("Step size. Default: the model's for its default type; for another type, "
                                     f"that type's, with lrDecay none: {models.type_rates()}.", 0, exclusive=True),
                "momentum": _num("Momentum coefficient (momentum, nesterov).", 0, below=1, default=0.9),
                "beta1": _num("Adam first-moment decay.", 0, below=1, default=0.9),
                "beta2": _num("Adam second-moment decay.", 0, below=1, default=0.999),
                "epsilon": _num("Adam denominator guard.", 0, exclusive=True, default=1e-8),
                "lrDecay": _choice("Learning-rate schedule: constant, or lr/sqrt(epoch) as the papers do for LR.",
                                   ["none", "sqrt-epoch"]),
            },
        ),
        "sync": _obj(
            "Synchronisation protocol between replicas.",
            {
                "protocol": _choice("bsp: every update every step; isp: significance filter; ssp: stale-synchronous "
                                    "with `slack`; averaging: model averaging, each worker runs `localSteps` steps "
                                    "alone, then the replicas exchange what they changed; blocked (" + _admitting("blocked") + " only): "
                                    "averaging's rounds over disjoint blocks of users and items (DSGD), so no "
                                    "two workers change the same row in a round; async: averaging without the "
                                    "round's barrier, a worker trains the next round while the last one closes "
                                    "(at most one round ahead); admm (" + _admitting("admm") + " only): consensus ADMM, "
                                    "averaging's rounds with each worker's local steps pulled towards the consensus "
                                    "by `rho` and its dual variables. Default: "
                                    + ", ".join(f"{t.name} {t.protocol}" for t in models.BUILT_IN) + ".",
                                    ["bsp", "isp", "ssp", "averaging", "blocked", "async", "admm"]),
                "significanceThreshold": _num("ISP threshold v; an entry is sent when |delta/x| > v/sqrt(step). "
                                              "Default: " + ", ".join(f"{t.name} {shown(t.significance_threshold)}"
                                                                      for t in models.BUILT_IN) + ".", 0),
                "slack": _int("SSP slack s: a worker at step t has applied every update up to t-s-1.", 0, 1000, default=3),
                "localSteps": _int("averaging, blocked, async, admm: the steps H a worker trains between two exchanges; each worker then "
                                   "publishes every entry it changed in those steps, and adds its peers'.", 1, 10000,
                                   default=LOCAL_STEPS),
                "rho": _num("admm: the penalty rho of the augmented Lagrangian, how hard a worker's local steps are "
                            "pulled towards the consensus minus its dual variable.", 0, exclusive=True, below=1e6,
                            default=RHO),
                "exchange": _choice("Who reads what. all-to-all: each worker reads every peer's update; allreduce: one "
                                    "worker per step merges them and every other worker reads the merged frame; "
                                    "scatter-reduce: the parameters are split into one partition per worker, each "
                                    "worker merges one partition and reads the others' merged partitions.",
                                    ["all-to-all", "allreduce", "scatter-reduce"], "all-to-all"),
            },
        ),
        "output": _obj(
            "Where the results go when the job ends.",
            {
                "uri": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Directory or fsspec URL (s3://...) the supervisor copies model.npz, summary.json and metrics.jsonl to; relative paths resolve like dataset.uri. Default: the run directory only (inside the supervisor pod on Kubernetes).",
                },
            },
        ),
        "stop": _obj(
            "When the job ends; the first condition reached wins. Without maxSteps, maxEpochs or maxSeconds, "
            f"training stops once the validation loss stops improving (patience {DEFAULT_PATIENCE}), or after "
            f"{DEFAULT_MAX_EPOCHS:g} epochs.",
            {
                "targetLoss": _num("Stop once the smoothed validation loss stays at or below this for `targetSteps` "
                                   "steps (the training loss when evaluation.everySteps is 0).", 0),
                "targetSteps": _int("Steps the loss must stay at or below targetLoss.", 1, default=10),
                "patience": _int("Stop after this many evaluations without improvement of the smoothed validation "
                                 f"loss. Default {DEFAULT_PATIENCE} when no step, epoch or seconds limit is set, "
                                 "otherwise off.", 1),
                "maxSteps": _int("Stop after this many steps.", 1),
                "maxEpochs": _num("Stop after this many passes over the training batches.", 0, exclusive=True),
                "maxSeconds": _num("Stop after this much wall-clock time.", 0, exclusive=True),
                "budgetUSD": _num("Stop when the serverless cost estimate reaches this many dollars.", 0, exclusive=True),
            },
        ),
        "evaluation": _obj(
            "Held-out evaluation by the supervisor.",
            {"everySteps": _int("Evaluate a replica snapshot on the validation split every N steps; 0 disables.", 0,
                                default=25)},
        ),
        "liveness": _obj(
            "Failure detection.",
            {
                "workerTimeoutSeconds": _num(
                    "A worker that has not reported an open step for this long is dropped from the barrier.", 0,
                    exclusive=True, default=60.0,
                ),
                "supervisorTimeoutSeconds": _num(
                    "A worker waiting for a step-close that hears nothing from the supervisor for this long stops, so "
                    "that the workers of a lost supervisor do not keep running and billing. A waiting supervisor "
                    "repeats its newest step-close every 5 s.", 10, default=30.0,
                ),
            },
        ),
        "autoscaler": _obj(
            "Scale-in auto-tuner (MLLess §4.2): after the loss curve's knee, remove workers while the projected "
            "loss with fewer workers stays within `threshold` of the full pool's.",
            {
                "enabled": _bool("Run the auto-tuner.", False),
                "intervalSeconds": _num("Re-evaluate this often after a removal.", 0, exclusive=True, default=20.0),
                "horizonSeconds": _num("Projection horizon Δ.", 0, exclusive=True, default=10.0),
                "threshold": _num("Remove another worker while the projected relative loss gap is below S.", 0,
                                  default=0.15),
                "minWorkers": _int("Never go below this many workers.", 1, default=1),
                "knee": _obj(
                    "Knee detection on the smoothed training loss.",
                    {
                        "method": _choice("slope (the papers') or kneedle.", ["slope", "kneedle"], "slope"),
                        "span": _int("EWMA span.", 1, default=20),
                        "slope": _num("Relative slope threshold: the knee is where d(loss)/dt / loss rises above -slope.",
                                      0, exclusive=True, default=1e-3),
                        "stableChecks": _int("The knee must stay put for this many checks.", 1, default=5),
                    },
                ),
            },
        ),
        "pricing": _obj(
            "Prices for the serverless cost estimate. Defaults are the papers' IBM Cloud prices (2021).",
            {
                # Upper bounds far above any real price: a cost that overflows to infinity cannot be reported.
                "functionMemoryGB": _num("Memory of each function.", 0, exclusive=True, below=1e4, default=2.0),
                "pricePerGBSecond": _num("Function price in $ per GB-second.", 0, below=1e3, default=1.7e-5),
                "billingGranularitySeconds": _num("Billing unit of a function invocation.", 0, exclusive=True,
                                                  below=86400, default=0.1),
                "redisPerHour": _num("Redis instance price in $/h.", 0, below=1e6, default=0.17),
                "rabbitmqPerHour": _num("RabbitMQ instance price in $/h.", 0, below=1e6, default=0.15),
                "vmPerHour": _num("Optional: price of a VM that would run the same job, for the IaaS comparison (papers: 0.2 $/h, 4 vCPU).", 0, below=1e6),
            },
        ),
    },
    ["model", "dataset"],
)


def walk(node: Schema, path: str) -> Iterator[tuple[str, Schema]]:
    """Every node of a schema with its dotted path, `node` (at `path`) first; an array's items are at `<array>[]`."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")


def schema_field(path: str, node: Schema = SPEC_SCHEMA) -> Schema:
    """The schema of the spec field at dotted `path` ("sync.significanceThreshold")."""
    for name in path.split("."):
        node = node["properties"][name]
    return node


def default(path: str) -> Any:
    """The schema's default of a spec field, by its dotted path ("sync.significanceThreshold")."""
    return schema_field(path)["default"]


def choices(path: str) -> tuple[str, ...]:
    """The allowed values of an enumerated spec field, by its dotted path ("model.type")."""
    return tuple(schema_field(path)["enum"])


#: Values a running program added to an enumerated field beyond the schema's (a sync strategy registered outside the
#: package: functions/mlless/runtime/sync/__init__.py). Validation in that program admits them; the CRD, generated
#: from SPEC_SCHEMA, does not list them.
_ADMITTED: dict[str, list[str]] = {}


def admit(path: str, value: str) -> None:
    """Accept `value` for the enumerated spec field at dotted `path` in this process's manifest validation."""
    _ADMITTED.setdefault(path, []).append(value)


def _str(description: str, enum: list[str] | None = None, fmt: str | None = None) -> Schema:
    node: Schema = {"type": "string", "description": description}
    if enum:
        node["enum"] = enum
    if fmt:
        node["format"] = fmt
    return node


_RESOURCES: Schema = {
    "type": "object",
    "description": "Kubernetes resource requests and limits (core/v1 ResourceRequirements).",
    "x-kubernetes-preserve-unknown-fields": True,
}


def _secret_key_ref(description: str) -> Schema:
    return _obj(description, {"name": _str("Secret name."), "key": _str("Key in the Secret.")}, ["name", "key"])


def _service(name: str, tls_scheme: str) -> Schema:
    """A backing service that is either managed by the operator (a StatefulSet) or external."""
    return _obj(
        f"{name}: managed by the operator (default), or an existing one given by URL.",
        {
            "url": _str(f"External {name} URL without the password ({tls_scheme}:// for TLS); the operator then "
                        f"creates no {name}."),
            "passwordSecretRef": _secret_key_ref("Secret key holding the external instance's password."),
            "caSecretRef": _secret_key_ref(
                f"Secret key holding the PEM bundle of the CA that signs the external instance's TLS certificate "
                f"({tls_scheme}://), trusted besides the system's CAs. Certificates and hostnames are always verified."
            ),
            "image": _str(f"Image of the managed {name}."),
            "storage": _str("Volume size of the managed instance, e.g. 1Gi; empty for none."),
            "resources": _RESOURCES,
        },
    )


# Fields only the operator reads: a local `mlless train` accepts and ignores them, so one manifest serves both.
CLUSTER_SPEC: dict[str, Schema] = {
    "function": _obj(
        "How worker functions are deployed.",
        {
            "backend": _str("Function platform; the operator falls back to pod when the chosen CRD is not served.",
                            ["knative", "openfaas", "pod"]),
            "image": _str("Worker image (default: the chart's image)."),
            "memory": _str("Memory per function, e.g. 2Gi."),
            "cpu": _str("CPU per function, e.g. 1."),
            "timeoutSeconds": _int("Invocation time limit; a worker checkpoints and is re-invoked before it.", 1),
            "env": {
                "type": "array",
                "description": "Extra environment variables (core/v1 EnvVar) for the workers and the supervisor, e.g. object-store credentials (both read the dataset; the supervisor writes output.uri).",
                "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        },
    ),
    "redis": _service("Redis", "rediss"),
    "rabbitmq": _service("RabbitMQ", "amqps"),
    "supervisor": _obj("The supervisor pod.", {"resources": _RESOURCES}),
    "suspend": {"type": "boolean", "description": "Checkpoint and scale to zero; unset to resume from the checkpoint."},
    "ttlSecondsAfterFinished": _int("Delete the job this long after it succeeds or fails.", 0),
    "activeDeadlineSeconds": _int("Fail the job once it has run this long.", 1),
    "backoffLimit": _int("How many times the operator recreates a supervisor pod that failed or was evicted or deleted before "
                         "the job fails (as a batch Job's, or KubeRay's RayJob's); the new supervisor resumes the job from Redis.",
                         0, default=3),
}
SPEC_SCHEMA["properties"].update(CLUSTER_SPEC)

CONDITION_TYPES = ["Created", "Running", "Suspended", "Succeeded", "Failed", "SupervisorRestarted", "PodsHealthy"]

STATUS_SCHEMA: Schema = _obj(
    "Observed state, written by the operator and the supervisor.",
    {
        "phase": _str("Lifecycle phase.", ["Pending", "Running", "Suspended", "Succeeded", "Failed"]),
        "conditions": {
            "type": "array",
            "description": "Standard metav1.Condition entries, one per type.",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
            "items": _obj(
                "A condition in the metav1.Condition shape.",
                {
                    "type": _str("Condition type.", CONDITION_TYPES),
                    "status": _str("True, False or Unknown.", ["True", "False", "Unknown"]),
                    "reason": _str("CamelCase reason, e.g. InvalidSpec."),
                    "message": _str("Human-readable detail."),
                    "lastTransitionTime": _str("When the status last changed.", fmt="date-time"),
                    "observedGeneration": _int("The .metadata.generation the condition was set for.", 0),
                },
                ["type", "status", "reason", "message", "lastTransitionTime"],
            ),
        },
        "observedGeneration": _int("The .metadata.generation last reconciled.", 0),
        "workers": _int("Workers currently in the job (the scale subresource's status replicas).", 0),
        "selector": _str("Label selector of the worker pods (the scale subresource's selector)."),
        "step": _int("Last closed step.", 0),
        "trainLoss": _num("Training loss of the last closed step."),
        "validationLoss": _num("Newest validation loss."),
        "costUSD": _num("Serverless cost so far in dollars.", 0),
        "startTime": _str("When training started.", fmt="date-time"),
        "completionTime": _str("When the job ended.", fmt="date-time"),
        "modelURI": _str("Where the final model was written."),
        "removedRanks": {
            "type": "array",
            "description": "Worker ranks the supervisor took out on scale-in; the operator removes these first.",
            "items": {"type": "integer", "minimum": 0},
        },
        "checkpointStep": _int("Step of the checkpoint a suspended job resumes from.", 0),
        "supervisorRestarts": _int("Times the operator recreated the supervisor pod (at most spec.backoffLimit).", 0),
    },
)


def _pairing_message(field: str, value: str, other: str, admitted: tuple[str, ...]) -> str:
    return f"spec.{field}: {value} needs spec.{other} {' or '.join(admitted)}"


def pairing_errors(spec: Any) -> Iterator[str]:
    """One line per pairing a parsed manifest's `spec` breaks, naming the field."""
    def given(path: str) -> Any:
        node = spec
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node
    for field, value, other, admitted in pairings(models.MODEL_TYPES.values()):
        if given(field) == value and given(other) not in admitted:
            yield f"{_pairing_message(field, value, other, admitted)}, not {given(other)}"


def cel_rules() -> list[Schema]:
    """The built-in models' pairings as the CRD's `x-kubernetes-validations` on the spec (CEL; Kubernetes 1.25+)."""
    rules = []
    for field, value, other, admitted in pairings(models.BUILT_IN):
        section, name = field.split(".")
        absent = f"!has(self.{section}) || !has(self.{field})"
        rules.append({"rule": f"{absent} || self.{field} != '{value}' || self.{other} in {list(admitted)}",
                      "message": _pairing_message(field, value, other, admitted)})
    return rules


SPEC_SCHEMA["x-kubernetes-validations"] = cel_rules()


def manifest_schema(strict: bool) -> Schema:
    """Schema of a whole TrainingJob document; `strict` forbids unknown fields (CLI use)."""
    spec = copy.deepcopy(SPEC_SCHEMA)
    for path, values in _ADMITTED.items():
        schema_field(path, spec)["enum"] += values
    schema_field("model.type", spec)["enum"] = list(models.MODEL_TYPES)
    if strict:
        _forbid_unknown(spec)
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "spec"],
        **({"additionalProperties": False} if strict else {}),
        "properties": {
            "apiVersion": {"type": "string", "enum": [API_VERSION]},
            "kind": {"type": "string", "enum": [KIND]},
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {
                        "type": "string",
                        "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                        "maxLength": 63,
                    }
                },
            },
            "spec": spec,
            "status": STATUS_SCHEMA,
        },
    }


def _forbid_unknown(node: Schema) -> None:
    if node.get("type") == "object" and "properties" in node:
        node["additionalProperties"] = False
        for child in node["properties"].values():
            _forbid_unknown(child)
