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
from mlless.spec import models, robust, schedule, sync_fields
from mlless.spec.pairings import (
    MINI_BATCH_PROTOCOLS, NEEDS, OPTIMIZER_TYPES, PER_SAMPLE_OPTIMIZERS, cel_rules, pairing_message, pairings,
)
from mlless.spec.registry import REGISTRIES
from mlless.spec.nodes import Schema, boolean, choice, integer, number, obj, shown, string

#: averaging's H. At P = 2 on the quick sets of benchmarks/time_to_quality.py (1M skewed ratings, 200k clicks; a
#: loaded 2-core machine, 3 runs each), H = 8, 16 and 32 reached the target within each other's noise; 8 sent twice
#: 16's bytes, and 32 needed up to twice 16's epochs on the ratings.
LOCAL_STEPS = 16
#: admm's ρ: on benchmarks/scaling.py's clicks the epochs to the target barely moved from 0.01 to 1, and 0.1 was
#: among the fastest at P = 3.
RHO = 0.1
#: Stop after this many evaluations without improvement, whatever the limits: a limit is a budget, and a job that
#: sets one as a safety cap still wants to end where its model stops improving (as in Keras, Katib and Ray Tune)...
DEFAULT_PATIENCE = 5
#: ...of more than this fraction of the best. On 12 recorded default runs (benchmarks/forecast.py: the quick sets and
#: the quickstart at P = 1-3), 0.001 handed back the same model as 0 in all 12 and stopped up to 18 % sooner.
MIN_DELTA = 0.001
#: ...or, without a step, epoch or seconds limit, should the validation loss keep creeping down (or evaluation be
#: off), after this many epochs.
DEFAULT_MAX_EPOCHS = 50.0


def model_fields(types: Iterable[models.ModelType]) -> Schema:
    """The `spec.model` fields the `types` declare (`ModelType.fields`), by name; a name two types declare must
    have one schema."""
    fields: Schema = {}
    for t in types:
        for name, node in t.fields.items():
            if fields.setdefault(name, node) != node:
                raise ValueError(f"model type {t.name}: spec.model.{name} differs from another type's")
    return fields


def _admitting(protocol: str) -> str:
    """The built-in model types `protocol` admits, for its description."""
    return ", ".join(t.name for t in models.BUILT_IN if NEEDS[protocol] in t.traits)


SPEC_SCHEMA: Schema = obj(
    "Desired state of a serverless training job: one supervisor and `workers` worker functions.",
    {
        "workers": integer("Number of worker functions P (replicas).", 1, 1024, default=3),
        "seed": integer("Seed for model initialisation and mini-batch order.", 0, default=0),
        "model": obj(
            "The model to train.",
            {
                "type": choice("; ".join(f"{t.name}: {t.summary} ({t.loss_metric.upper()})" for t in models.BUILT_IN)
                               + ".", [t.name for t in models.BUILT_IN]),
                **model_fields(models.BUILT_IN),
                "l2": number("Weight decay applied to the parameters a mini-batch touches (pmf: a penalty in its "
                             f"loss). Default per model; under optimizer adamw {models.ADAMW_WEIGHT_DECAY:g}, pmf's its own.", 0),
                "initFrom": {**string("Warm start: a model.npz written by an earlier job (its output.uri or run directory, "
                                   "or the file; a path or fsspec URL, relative paths resolve like dataset.uri). Every "
                                   "replica starts from it instead of the seed; its type and dimensions must be the "
                                   "job's."), "minLength": 1},
            },
            ["type"],
        ),
        "dataset": obj(
            "Mini-batches written by `mlless prepare`.",
            {
                "uri": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Directory or fsspec URL (s3://...) holding manifest.json; relative paths resolve against the manifest file's folder.",
                },
                "cacheBatches": boolean("Keep mini-batches in worker memory after the first read.", False),
            },
            ["uri"],
        ),
        "optimizer": obj(
            "Optimizer applied by each worker to its local replica. Defaults depend on the model.",
            {
                "type": choice("Update rule. adagrad updates per sample inside the mini-batch (LIBMF, Vowpal Wabbit); "
                               "normalized too, with each feature's step scaled by the largest value it has taken "
                               "(Vowpal Wabbit's default; the linear models only); the others take one step per "
                               "mini-batch. adam and adamw are one rule, Adam with decoupled weight decay "
                               "(spec.model.l2, as AdamW applies it); adamw's decay defaults to "
                               f"{models.ADAMW_WEIGHT_DECAY:g} (PyTorch's AdamW) instead of the model's l2."
                               + "".join(f" {t.name} trains with {' or '.join(sorted(t.optimizers))} only, whose "
                                         "learning rate scales its own rule." for t in models.BUILT_IN if t.optimizers),
                               OPTIMIZER_TYPES),
                "learningRate": number("Step size. Default: the model's for its default type; for another type, "
                                       f"that type's, with lrDecay none: {models.type_rates()}.", 0, exclusive=True),
                "momentum": number("Momentum coefficient (momentum, nesterov).", 0, below=1, default=0.9),
                "beta1": number("Adam first-moment decay.", 0, below=1, default=0.9),
                "beta2": number("Adam second-moment decay.", 0, below=1, default=0.999),
                "epsilon": number("Adam denominator guard.", 0, exclusive=True, default=1e-8),
                **schedule.FIELDS,
            },
        ),
        "sync": obj(
            "Synchronisation protocol between replicas.",
            {
                "protocol": choice("bsp: every update every step; gradient-averaging (" + _admitting("gradient-averaging")
                                   + " only): every step the workers average their mini-batch gradients and each "
                                   "replica takes one optimizer step by the mean (LambdaML's GA-SGD, as PyTorch DDP); "
                                   "isp: significance filter; ssp: stale-synchronous "
                                   "with `slack`; averaging: model averaging, each worker runs `localSteps` steps "
                                   "alone, then the replicas exchange what they changed; blocked (" + _admitting("blocked") + " only): "
                                   "averaging's rounds over disjoint blocks of users and items (DSGD), so no "
                                   "two workers change the same row in a round; async: averaging without the "
                                   "round's barrier, a worker trains the next round while the last one closes "
                                   "(at most one round ahead); admm (" + _admitting("admm") + " only): consensus ADMM, "
                                   "averaging's rounds with each worker's local steps pulled towards the consensus "
                                   "by `rho` and its dual variables; norm-isp: SPIRT's filter for networks, BSP's "
                                   "barrier, and a worker sends its whole accumulated update once its norms pass "
                                   "`normThreshold`, which every replica adds divided by the workers. Default: "
                                   + ", ".join(f"{t.name} {t.protocol}" for t in models.BUILT_IN) + ".",
                                   ["bsp", "gradient-averaging", "isp", "ssp", "averaging", "blocked", "async", "admm",
                                    "norm-isp"]),
                "significanceThreshold": number("ISP threshold v; an entry is sent when |delta/x| > v/sqrt(step). "
                                                "Default: " + ", ".join(f"{t.name} {shown(t.significance_threshold)}"
                                                                        for t in models.BUILT_IN) + ".", 0),
                "slack": integer("SSP slack s: a worker at step t has applied every update up to t-s-1.", 0, 1000, default=3),
                "localSteps": integer("averaging, blocked, async, admm: the steps H a worker trains between two exchanges; each worker then "
                                      "publishes every entry it changed in those steps, and adds its peers'.", 1, 10000,
                                      default=LOCAL_STEPS),
                "rho": number("admm: the penalty rho of the augmented Lagrangian, how hard a worker's local steps are "
                              "pulled towards the consensus minus its dual variable.", 0, exclusive=True, below=1e6,
                              default=RHO),
                "exchange": choice("Who reads what. all-to-all: each worker reads every peer's update; allreduce: one "
                                   "worker per step merges them and every other worker reads the merged frame; "
                                   "scatter-reduce: the parameters are split into one partition per worker, each "
                                   "worker merges one partition and reads the others' merged partitions; in-store: "
                                   "a Lua script in Redis merges them and every worker reads the merged frame "
                                   "(needs Redis, and aggregation sum; docs/architecture.md).",
                                   ["all-to-all", "allreduce", "scatter-reduce", "in-store"], "all-to-all"),
                "aggregation": choice("How a step's updates are combined: sum adds them; the Byzantine-robust rules "
                                      "take n times a robust centre of the n updates instead of their sum: median "
                                      "(coordinate-wise), trimmed-mean (per coordinate, without the `trim` largest "
                                      "and smallest) and krum (Multi-Krum: the mean of the n - f updates closest "
                                      "to their neighbours), for which a coordinate a worker did not send counts as "
                                      "its 0; carrier-trimmed-mean (for sparse models: the updates whose norm exceeds "
                                      "a multiple of the median norm left out, then per coordinate the trimmed mean "
                                      "over only the workers that sent it, times their count). The "
                                      f"robust rules need {' or '.join(robust.PROTOCOLS)} and at least "
                                      f"{robust.MIN_WORKERS} workers (docs/robustness.md).",
                                      ["sum", "median", "trimmed-mean", "krum", "carrier-trimmed-mean"], "sum"),
                "trim": number("trimmed-mean, krum, carrier-trimmed-mean: the fraction of a step's n updates assumed Byzantine, f = "
                               "floor(trim * n), at most (n - 1) / 2.", 0, below=0.5, default=robust.TRIM),
                **sync_fields.FIELDS,
            },
        ),
        "output": obj(
            "Where the results go when the job ends.",
            {
                "uri": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Directory or fsspec URL (s3://...) the supervisor copies model.npz, summary.json and metrics.jsonl to, and the model in its own library's format (a neural-net's model.pt); relative paths resolve like dataset.uri. Default: the run directory only (inside the supervisor pod on Kubernetes).",
                },
            },
        ),
        "stop": obj(
            "When the job ends; the first condition reached wins. Training stops once the validation loss stops "
            f"improving (patience {DEFAULT_PATIENCE}), with or without limits; without maxSteps, maxEpochs or "
            f"maxSeconds, also after {DEFAULT_MAX_EPOCHS:g} epochs.",
            {
                "targetLoss": number("Stop once the smoothed validation loss stays at or below this for `targetSteps` "
                                     "steps (the training loss when evaluation.everySteps is 0).", 0),
                "targetSteps": integer("Steps the loss must stay at or below targetLoss.", 1, default=10),
                "patience": integer("Stop after this many evaluations without improvement of the smoothed validation "
                                    "loss, whatever limits are set (they cap the job, patience may end it sooner); "
                                    "0 turns it off, and the job runs to its limits or targetLoss.", 0,
                                    default=DEFAULT_PATIENCE),
                "minDelta": number("An improvement of the smoothed validation loss smaller than this fraction of its "
                                   "best so far does not count for patience (a loss wandering around its best by "
                                   "0.0001 kept restarting the count).", 0, below=1, default=MIN_DELTA),
                "maxSteps": integer("Stop after this many steps.", 1),
                "maxEpochs": number("Stop after this many passes over the training batches.", 0, exclusive=True),
                "maxSeconds": number("Stop after this much wall-clock time.", 0, exclusive=True),
                "budgetUSD": number("Stop when the serverless cost estimate reaches this many dollars.", 0, exclusive=True),
            },
        ),
        "evaluation": obj(
            "Held-out evaluation by the supervisor.",
            {"everySteps": integer("Evaluate a replica snapshot on the validation split every N steps; 0 disables.", 0,
                                   default=25)},
        ),
        "liveness": obj(
            "Failure detection.",
            {
                "workerTimeoutSeconds": number(
                    "A worker that has not reported an open step for this long is dropped from the barrier.", 0,
                    exclusive=True, default=60.0,
                ),
                "supervisorTimeoutSeconds": number(
                    "A worker waiting for a step-close that hears nothing from the supervisor for this long stops, so "
                    "that the workers of a lost supervisor do not keep running and billing. A waiting supervisor "
                    "repeats its newest step-close every 5 s.", 10, default=30.0,
                ),
            },
        ),
        "autoscaler": obj(
            "Scale-in auto-tuner (MLLess §4.2): after the loss curve's knee, remove workers while the projected "
            "loss with fewer workers stays within `threshold` of the full pool's.",
            {
                "enabled": boolean("Run the auto-tuner.", False),
                "intervalSeconds": number("Re-evaluate this often after a removal.", 0, exclusive=True, default=20.0),
                "horizonSeconds": number("Projection horizon Δ.", 0, exclusive=True, default=10.0),
                "threshold": number("Remove another worker while the projected relative loss gap is below S.", 0,
                                    default=0.15),
                "minWorkers": integer("Never go below this many workers.", 1, default=1),
                "knee": obj(
                    "Knee detection on the smoothed training loss.",
                    {
                        "method": choice("slope (the papers') or kneedle.", ["slope", "kneedle"], "slope"),
                        "span": integer("EWMA span.", 1, default=20),
                        "slope": number("Relative slope threshold: the knee is where d(loss)/dt / loss rises above -slope.",
                                        0, exclusive=True, default=1e-3),
                        "stableChecks": integer("The knee must stay put for this many checks.", 1, default=5),
                    },
                ),
            },
        ),
        "pricing": obj(
            "Prices for the serverless cost estimate. Defaults are the papers' IBM Cloud prices (2021).",
            {
                # Upper bounds far above any real price: a cost that overflows to infinity cannot be reported.
                "functionMemoryGB": number("Memory of each function.", 0, exclusive=True, below=1e4, default=2.0),
                "pricePerGBSecond": number("Function price in $ per GB-second.", 0, below=1e3, default=1.7e-5),
                "billingGranularitySeconds": number("Billing unit of a function invocation.", 0, exclusive=True,
                                                    below=86400, default=0.1),
                "redisPerHour": number("Redis instance price in $/h.", 0, below=1e6, default=0.17),
                "rabbitmqPerHour": number("RabbitMQ instance price in $/h.", 0, below=1e6, default=0.15),
                "vmPerHour": number("Optional: price of a VM that would run the same job, for the IaaS comparison (papers: 0.2 $/h, 4 vCPU).", 0, below=1e6),
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


_RESOURCES: Schema = {
    "type": "object",
    "description": "Kubernetes resource requests and limits (core/v1 ResourceRequirements).",
    "x-kubernetes-preserve-unknown-fields": True,
}


def _secret_key_ref(description: str) -> Schema:
    return obj(description, {"name": string("Secret name."), "key": string("Key in the Secret.")}, ["name", "key"])


def _service(name: str, tls_scheme: str, extra: dict[str, Schema] | None = None) -> Schema:
    """A backing service that is either managed by the operator (a StatefulSet) or external; `extra`: its own fields."""
    return obj(
        f"{name}: managed by the operator (default), or an existing one given by URL.",
        {
            "url": string(f"External {name} URL without the password ({tls_scheme}:// for TLS); the operator then "
                          f"creates no {name}."),
            "passwordSecretRef": _secret_key_ref("Secret key holding the external instance's password."),
            "caSecretRef": _secret_key_ref(
                f"Secret key holding the PEM bundle of the CA that signs the external instance's TLS certificate "
                f"({tls_scheme}://), trusted besides the system's CAs. Certificates and hostnames are always verified."
            ),
            "image": string(f"Image of the managed {name}."),
            "storage": string("Volume size of the managed instance, e.g. 1Gi; empty for none."),
            "resources": _RESOURCES,
            **(extra or {}),
        },
    )


# Fields only the operator reads: a local `mlless train` accepts and ignores them, so one manifest serves both.
CLUSTER_SPEC: dict[str, Schema] = {
    "function": obj(
        "How worker functions are deployed.",
        {
            "backend": string("Function platform; the operator falls back to pod when the chosen CRD is not served.",
                              ["knative", "openfaas", "pod"]),
            "image": string("Image of the workers and the supervisor. Default: the chart's image, or its "
                            "operator.extraImages entry for the package extra the model type needs ("
                            + ", ".join(f"{t.name} {t.extra}" for t in models.BUILT_IN if t.extra) + ")."),
            "memory": string(f"Memory per function, e.g. 2Gi. Default: the model type's, "
                             f"{models.function_memory_defaults()}."),
            "cpu": string("CPU per function, e.g. 1 (the request; a network's worker computes on as many "
                          "torch threads, rounded up)."),
            "timeoutSeconds": integer("Invocation time limit; a worker checkpoints and is re-invoked before it.", 1),
            "env": {
                "type": "array",
                "description": "Extra environment variables (core/v1 EnvVar) for the workers and the supervisor, e.g. object-store credentials (both read the dataset; the supervisor writes output.uri).",
                "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        },
    ),
    "redis": _service("Redis", "rediss", {"shards": integer(
        "How many Redis instances the operator runs for the job (each its own StatefulSet and Service): workers' "
        "update slots and checkpoints are spread over them by rank, job-level keys live on the first, and a key "
        "numbered by a partition or a block of rows on that number's shard (functions/mlless/transport/shards.py). "
        "Fixed once the job exists. An external sharded Redis lists one URL per shard in url, separated by spaces, "
        "instead. Locally, repeat --redis-url.", 1, 16, default=1) | {"x-kubernetes-validations": [{
            # The shards' StatefulSets and the URLs in the job Secret are made once: a change on a running job would
            # leave the old ones running, or start shards no process uses.
            "rule": "self == oldSelf", "message": "spec.redis.shards cannot change once the job exists"}]}}),
    "rabbitmq": _service("RabbitMQ", "amqps"),
    "supervisor": obj("The supervisor pod.", {"resources": _RESOURCES}),
    "suspend": {"type": "boolean", "description": "Checkpoint and scale to zero; unset to resume from the checkpoint."},
    "ttlSecondsAfterFinished": integer("Delete the job this long after it succeeds or fails.", 0),
    "activeDeadlineSeconds": integer("Fail the job once it has run this long.", 1),
    "backoffLimit": integer("How many times the operator recreates a supervisor pod that failed or was evicted or deleted before "
                            "the job fails (as a batch Job's, or KubeRay's RayJob's); the new supervisor resumes the job from Redis.",
                            0, default=3),
}
SPEC_SCHEMA["properties"].update(CLUSTER_SPEC)

CONDITION_TYPES = ["Created", "Running", "Suspended", "Succeeded", "Failed", "SupervisorRestarted", "PodsHealthy"]

STATUS_SCHEMA: Schema = obj(
    "Observed state, written by the operator and the supervisor.",
    {
        "phase": string("Lifecycle phase.", ["Pending", "Running", "Suspended", "Succeeded", "Failed"]),
        "conditions": {
            "type": "array",
            "description": "Standard metav1.Condition entries, one per type.",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
            "items": obj(
                "A condition in the metav1.Condition shape.",
                {
                    "type": string("Condition type.", CONDITION_TYPES),
                    "status": string("True, False or Unknown.", ["True", "False", "Unknown"]),
                    "reason": string("CamelCase reason, e.g. InvalidSpec."),
                    "message": string("Human-readable detail."),
                    "lastTransitionTime": string("When the status last changed.", fmt="date-time"),
                    "observedGeneration": integer("The .metadata.generation the condition was set for.", 0),
                },
                ["type", "status", "reason", "message", "lastTransitionTime"],
            ),
        },
        "observedGeneration": integer("The .metadata.generation last reconciled.", 0),
        "workers": integer("Workers currently in the job (the scale subresource's status replicas).", 0),
        "selector": string("Label selector of the worker pods (the scale subresource's selector)."),
        "step": integer("Last closed step.", 0),
        "trainLoss": number("Training loss of the last closed step."),
        "validationLoss": number("Newest validation loss."),
        "costUSD": number("Serverless cost so far in dollars.", 0),
        "epoch": number("Passes over the training batches so far.", 0),
        "progress": {**number("Fraction done (0 to 1) of the stop limit nearest to ending the job: the one with the "
                              "least time left, named by progressLimit.", 0), "maximum": 1},
        "progressLimit": string("The spec.stop field of that limit: maxSteps, maxEpochs, maxSeconds or budgetUSD, or "
                                "targetLoss or patience, projected on the fitted validation curve."),
        "etaSeconds": number("Seconds until that limit ends the job, at the job's pace so far.", 0),
        "etaLowSeconds": number("With targetLoss or patience: the ETA of the early tenth of the futures projected "
                                "on the validation curve. Absent for a limit known in advance.", 0),
        "etaHighSeconds": number("With targetLoss or patience: the ETA of the late tenth of those futures (or of the "
                                 "nearest other limit, if it ends them sooner).", 0),
        "projectedCostUSD": number("The job's cost at its end in dollars: the cost so far plus the bill's pace until "
                                   "the ETA.", 0),
        "startTime": string("When training started.", fmt="date-time"),
        "completionTime": string("When the job ended.", fmt="date-time"),
        "modelURI": string("Where the final model was written."),
        "removedRanks": {
            "type": "array",
            "description": "Worker ranks the supervisor took out on scale-in; the operator removes these first.",
            "items": {"type": "integer", "minimum": 0},
        },
        "checkpointStep": integer("Step of the checkpoint a suspended job resumes from.", 0),
        "supervisorRestarts": integer("Times the operator recreated the supervisor pod (at most spec.backoffLimit).", 0),
    },
)


def pairing_errors(spec: Any) -> Iterator[str]:
    """One line per pairing a parsed manifest's `spec` breaks, naming the field."""
    def given(path: str) -> Any:
        node = spec
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node
    for field, value, other, admitted in pairings(models.MODEL_TYPES.values()):
        if given(field) == value and given(other) not in admitted:
            yield f"{pairing_message(field, value, other, admitted)}, not {given(other)}"
    kind = given("model.type")
    known = models.model_type(kind) if kind in models.MODEL_TYPES else None
    protocol = given("sync.protocol") or (known and known.protocol)
    optimizer = given("optimizer.type") or (known and known.optimizer.type)
    if protocol in MINI_BATCH_PROTOCOLS and optimizer in PER_SAMPLE_OPTIMIZERS:
        yield (f"spec.optimizer.type: {optimizer} updates per sample, and spec.sync.protocol {protocol} averages "
               f"mini-batch gradients: choose one of {', '.join(t for t in OPTIMIZER_TYPES if t not in PER_SAMPLE_OPTIMIZERS)}")
    yield from robust.errors(spec, models.model_type(kind).protocol if kind in models.MODEL_TYPES else "",
                             default("workers"))
    yield from schedule.errors(spec)
    yield from sync_fields.errors(spec)
    shards = given("redis.shards")
    if isinstance(shards, int) and (line := robust.one_redis_error(given("sync.exchange"), shards,
                                                                    f"spec.redis.shards is {shards}")):
        yield line


SPEC_SCHEMA["x-kubernetes-validations"] = cel_rules()


def manifest_schema(strict: bool) -> Schema:
    """Schema of a whole TrainingJob document; `strict` forbids unknown fields (CLI use)."""
    spec = copy.deepcopy(SPEC_SCHEMA)
    for path, registry in REGISTRIES.items():  # the names registered in this process, a plugin's too
        built_in = choices(path)
        schema_field(path, spec)["enum"] = [*built_in, *(n for n in registry if n not in built_in)]
    # A copy: `forbid_unknown` below must not mark an object field (model.augment) in its ModelType.
    schema_field("model", spec)["properties"] |= copy.deepcopy(model_fields(models.MODEL_TYPES.values()))
    if strict:
        forbid_unknown(spec)
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


def forbid_unknown(node: Schema) -> None:
    """Make every object below `node` refuse fields its schema does not name (a local manifest's typo)."""
    if node.get("type") == "object" and "properties" in node:
        node["additionalProperties"] = False
        for child in node["properties"].values():
            forbid_unknown(child)
