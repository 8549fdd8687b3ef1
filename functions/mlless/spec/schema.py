"""The one JSON schema of a TrainingJob.

The CLI validates manifests with it (`mlless.spec.load`) and the CRD's
`openAPIV3Schema` is generated from it, so a field exists in exactly one
place. It is kept inside the Kubernetes structural-schema subset (every node
typed, no `additionalProperties` beside `properties`); the CLI adds
`additionalProperties: false` when validating so that a typo in a local
manifest is an error rather than silently ignored, as the API server would
prune it.
"""
from __future__ import annotations

import copy
from typing import Any

API_VERSION = "mlless.io/v1alpha1"
KIND = "TrainingJob"

Schema = dict[str, Any]


def _num(description: str, minimum: float | None = None, exclusive: bool = False, below: float | None = None) -> Schema:
    """A number >= minimum (> with `exclusive`) and, if given, strictly below `below`."""
    node: Schema = {"type": "number", "description": description}
    if minimum is not None:
        node["exclusiveMinimum" if exclusive else "minimum"] = minimum
    if below is not None:
        node["exclusiveMaximum"] = below
    return node


def _int(description: str, minimum: int | None = None, maximum: int | None = None) -> Schema:
    node: Schema = {"type": "integer", "description": description}
    if minimum is not None:
        node["minimum"] = minimum
    if maximum is not None:
        node["maximum"] = maximum
    return node


def _obj(description: str, properties: dict[str, Schema], required: list[str] | None = None) -> Schema:
    node: Schema = {"type": "object", "description": description, "properties": properties}
    if required:
        node["required"] = required
    return node


SPEC_SCHEMA: Schema = _obj(
    "Desired state of a serverless training job: one supervisor and `workers` worker functions.",
    {
        "workers": _int("Number of worker functions P (replicas). Default 3.", 1, 1024),
        "seed": _int("Seed for model initialisation and mini-batch order. Default 0.", 0),
        "model": _obj(
            "The model to train.",
            {
                "type": {
                    "type": "string",
                    "enum": ["pmf", "logistic-regression"],
                    "description": "pmf: biased matrix factorisation (RMSE); logistic-regression: sparse LR on hashed features (BCE).",
                },
                "rank": _int("Latent factors per user and item (pmf). Default 20.", 1, 1024),
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
                "cacheBatches": {
                    "type": "boolean",
                    "description": "Keep mini-batches in worker memory after the first read. Default false.",
                },
            },
            ["uri"],
        ),
        "optimizer": _obj(
            "Optimizer applied by each worker to its local replica. Defaults depend on the model.",
            {
                "type": {"type": "string", "enum": ["sgd", "momentum", "nesterov", "adam"], "description": "Update rule."},
                "learningRate": _num("Step size.", 0, exclusive=True),
                "momentum": _num("Momentum coefficient (momentum, nesterov).", 0, below=1),
                "beta1": _num("Adam first-moment decay.", 0, below=1),
                "beta2": _num("Adam second-moment decay.", 0, below=1),
                "epsilon": _num("Adam denominator guard.", 0, exclusive=True),
                "lrDecay": {
                    "type": "string",
                    "enum": ["none", "sqrt-epoch"],
                    "description": "Learning-rate schedule: constant, or lr/sqrt(epoch) as the papers do for LR.",
                },
            },
        ),
        "sync": _obj(
            "Synchronisation protocol between replicas.",
            {
                "protocol": {
                    "type": "string",
                    "enum": ["bsp", "isp", "ssp"],
                    "description": "bsp: every update every step; isp: significance filter (default); ssp: stale-synchronous with `slack`.",
                },
                "significanceThreshold": _num("ISP threshold v; an entry is sent when |delta/x| > v/sqrt(step). Default 0.7.", 0),
                "slack": _int("SSP slack s: a worker at step t has applied every update up to t-s-1. Default 3.", 0, 1000),
            },
        ),
        "stop": _obj(
            "When the job ends; the first condition reached wins. With none given, training stops after 10 epochs.",
            {
                "targetLoss": _num("Stop once the training loss stays at or below this for `targetSteps` consecutive steps.", 0),
                "targetSteps": _int("Consecutive steps at or below targetLoss. Default 10.", 1),
                "maxSteps": _int("Stop after this many steps.", 1),
                "maxEpochs": _num("Stop after this many passes over the training batches.", 0, exclusive=True),
                "maxSeconds": _num("Stop after this much wall-clock time.", 0, exclusive=True),
                "budgetUSD": _num("Stop when the serverless cost estimate reaches this many dollars.", 0, exclusive=True),
            },
        ),
        "evaluation": _obj(
            "Held-out evaluation by the supervisor.",
            {"everySteps": _int("Evaluate a replica snapshot on the validation split every N steps. Default 25; 0 disables.", 0)},
        ),
        "liveness": _obj(
            "Failure detection.",
            {
                "workerTimeoutSeconds": _num(
                    "A worker that has not reported an open step for this long is dropped from the barrier. Default 60.", 0, exclusive=True
                ),
            },
        ),
        "autoscaler": _obj(
            "Scale-in auto-tuner (MLLess §4.2): after the loss curve's knee, remove workers while the projected "
            "loss with fewer workers stays within `threshold` of the full pool's.",
            {
                "enabled": {"type": "boolean", "description": "Run the auto-tuner. Default false."},
                "intervalSeconds": _num("Re-evaluate this often after a removal. Default 20.", 0, exclusive=True),
                "horizonSeconds": _num("Projection horizon Δ. Default 10.", 0, exclusive=True),
                "threshold": _num("Remove another worker while the projected relative loss gap is below S. Default 0.15.", 0),
                "minWorkers": _int("Never go below this many workers. Default 1.", 1),
                "knee": _obj(
                    "Knee detection on the smoothed training loss.",
                    {
                        "method": {"type": "string", "enum": ["slope", "kneedle"], "description": "Default slope (the papers')."},
                        "span": _int("EWMA span. Default 20.", 1),
                        "slope": _num("Relative slope threshold: the knee is where d(loss)/dt / loss rises above -slope.", 0, exclusive=True),
                        "stableChecks": _int("The knee must stay put for this many checks. Default 5.", 1),
                    },
                ),
            },
        ),
        "pricing": _obj(
            "Prices for the serverless cost estimate. Defaults are the papers' IBM Cloud prices (2021).",
            {
                "functionMemoryGB": _num("Memory of each function. Default 2.", 0, exclusive=True),
                "pricePerGBSecond": _num("Function price in $ per GB-second. Default 1.7e-5.", 0),
                "billingGranularitySeconds": _num("Billing unit of a function invocation. Default 0.1.", 0, exclusive=True),
                "redisPerHour": _num("Redis instance price in $/h. Default 0.17.", 0),
                "rabbitmqPerHour": _num("RabbitMQ instance price in $/h. Default 0.15.", 0),
                "vmPerHour": _num("Optional: price of a VM that would run the same job, for the IaaS comparison (papers: 0.2 $/h, 4 vCPU).", 0),
            },
        ),
    },
    ["model", "dataset"],
)

STATUS_SCHEMA: Schema = {
    "type": "object",
    "description": "Observed state, written by the operator and the supervisor.",
    "x-kubernetes-preserve-unknown-fields": True,
}


def manifest_schema(strict: bool) -> Schema:
    """Schema of a whole TrainingJob document; `strict` forbids unknown fields (CLI use)."""
    spec = copy.deepcopy(SPEC_SCHEMA)
    if strict:
        _forbid_unknown(spec)
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "spec"],
        "properties": {
            "apiVersion": {"type": "string", "const": API_VERSION},
            "kind": {"type": "string", "const": KIND},
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
