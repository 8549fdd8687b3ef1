"""The one schema of a TrainingSweep: trials of a TrainingJob template over a search space, with early stopping.

`mlless sweep` validates sweep manifests with it (`mlless.sweep.manifest`), and the CRD (crds/trainingsweep.yaml,
`mlless.spec.sweep_crd`) and docs/sweep-reference.md (`mlless.spec.sweep_reference`) are generated from it, as the
TrainingJob's are from `mlless.spec.schema`. The template's spec is the TrainingJob's own schema, so the API server
checks a template as it checks a job.
"""
from __future__ import annotations

import copy
from typing import Any

from mlless.contract import API_VERSION, SWEEP_KIND
from mlless.spec.nodes import Schema, choice, integer, number, obj, string
from mlless.spec.schema import SPEC_SCHEMA, forbid_unknown, manifest_schema

#: ASHA's reduction factor η: a trial goes on past a rung if its loss there is in the best 1/η of the trials' that
#: reached it (Li et al., "A System for Massively Parallel Hyperparameter Tuning", and Ray Tune's default).
REDUCTION_FACTOR = 3.0
#: Trials running at once unless the sweep says otherwise: two fit this project's 2-core reference machine.
MAX_CONCURRENT_TRIALS = 2

#: How a parameter picks its values: each key is one way, a parameter names exactly one.
SAMPLERS = ("grid", "choice", "uniform", "logUniform")


def _range(description: str) -> Schema:
    node = obj(description, {"min": number("Lower end (included)."), "max": number("Upper end.")}, ["min", "max"])
    node["x-kubernetes-validations"] = [{"rule": "self.min < self.max", "message": "empty range: min must be below max"}]
    return node


def _values(description: str) -> Schema:
    # A value is whatever the field it sets takes (a number, a string, a boolean): the TrainingJob's schema checks it.
    return {"type": "array", "description": description, "minItems": 1,
            "items": {"x-kubernetes-preserve-unknown-fields": True}}


PARAMETER_SCHEMA: Schema = obj(
    "One spec field of the template and the values its trials take; exactly one of grid, choice, uniform, logUniform.",
    {
        "field": {"type": "string", "minLength": 1,
                  "description": "Dotted path of a TrainingJob spec field, e.g. optimizer.learningRate or model.rank."},
        "grid": _values("Every value, each in its own trials: the sweep runs the product of its grid parameters."),
        "choice": _values("Values drawn at random, one per trial."),
        "uniform": _range("A number drawn uniformly from [min, max) per trial (rounded for an integer field)."),
        "logUniform": _range("A number whose logarithm is drawn uniformly per trial; min must be above 0."),
    },
    ["field"],
)
PARAMETER_SCHEMA["x-kubernetes-validations"] = [{
    "rule": " + ".join(f"(has(self.{s}) ? 1 : 0)" for s in SAMPLERS) + " == 1",
    "message": "a parameter takes exactly one of " + ", ".join(SAMPLERS),
}]

SWEEP_SCHEMA: Schema = obj(
    "Desired state of a hyperparameter sweep: trials of `template`, each a TrainingJob with some spec fields set "
    "from `parameters`, at most `maxConcurrentTrials` at once, losers stopped early by `earlyStopping`.",
    {
        "template": obj("The TrainingJob every trial starts from.",
                        {"spec": copy.deepcopy(SPEC_SCHEMA)}, ["spec"]),
        "parameters": {"type": "array", "description": "The search space: the spec fields the trials vary.",
                       "minItems": 1, "items": PARAMETER_SCHEMA},
        "maxTrials": integer("Trials to run. Default: the number of grid points; required when a parameter is drawn "
                             "at random (choice, uniform, logUniform).", 1, 10000),
        "maxConcurrentTrials": integer("Trials running at once.", 1, 1000, default=MAX_CONCURRENT_TRIALS),
        "budgetUSD": number("Stop every trial and start no more once the trials' serverless cost reaches this many "
                            "dollars; a trial's own stop.budgetUSD may not exceed it.", 0, exclusive=True),
        "seed": integer("Seed of the random draws (choice, uniform, logUniform).", 0, default=0),
        "earlyStopping": obj(
            "Stopping losing trials early on their validation loss.",
            {
                "type": choice("asha: asynchronous successive halving; at each rung (minResource × "
                               "reductionFactor^k) a trial whose best validation loss so far is not in the best "
                               "1/reductionFactor of the trials that reached the rung is stopped. none: every trial "
                               "runs to its own stop rule.", ["asha", "none"], "asha"),
                "resource": choice("What the rungs count.", ["steps", "epochs"], "epochs"),
                "minResource": number("The first rung.", 0, exclusive=True, default=1.0),
                "reductionFactor": number("η: the rungs' ratio and the fraction 1/η a rung keeps.", 1,
                                          exclusive=True, default=REDUCTION_FACTOR),
            },
        ),
        "output": obj("Where the best trial's model and record are copied when the sweep ends.",
                      {"uri": {"type": "string", "minLength": 1, "description":
                               "Directory or fsspec URL; relative paths resolve against the manifest's folder. "
                               "Locally the sweep directory's best/ holds them too."}}),
    },
    ["template", "parameters"],
)

TRIAL_STATES = ["Pending", "Running", "Succeeded", "Stopped", "Failed"]

TRIAL_SCHEMA: Schema = obj(
    "One trial.",
    {
        "name": string("The trial's TrainingJob (locally: its run directory under trials/)."),
        "parameters": {"type": "object", "description": "The field values this trial sets.",
                       "x-kubernetes-preserve-unknown-fields": True},
        "state": string("Stopped: stopped early by the sweep (killedAt says where).", TRIAL_STATES),
        "step": integer("Last closed step.", 0),
        "bestValidationLoss": number("The best validation loss of the trial so far."),
        "costUSD": number("The trial's serverless cost.", 0),
        "rung": integer("Rungs the trial has passed.", 0),
        "rungLosses": {"type": "array", "description": "Its best validation loss when it reached each rung.",
                       "items": {"type": "number"}},
        "killedAt": integer("The step at which the sweep stopped it.", 0),
        "stopReason": string("Why the trial ended."),
        "modelURI": string("Where the trial's model was written."),
    },
)

SWEEP_STATUS_SCHEMA: Schema = obj(
    "Observed state, written by the operator (locally: status.json in the sweep directory).",
    {
        "phase": string("Lifecycle phase.", ["Pending", "Running", "Succeeded", "Failed"]),
        "message": string("Why the sweep failed, or what it is waiting for."),
        "trialsCreated": integer("Trials started so far.", 0),
        "trialsRunning": integer("Trials running now.", 0),
        "bestTrial": string("The trial with the lowest best validation loss."),
        "bestValidationLoss": number("Its best validation loss."),
        "bestModelURI": string("Its model (copied to spec.output.uri when given)."),
        "costUSD": number("The trials' serverless cost so far in dollars.", 0),
        "trials": {"type": "array", "description": "The trials table.", "items": TRIAL_SCHEMA},
    },
)


def sweep_manifest_schema() -> Schema:
    """Schema of a whole TrainingSweep document as the CLI checks it: unknown fields refused, the template's spec as
    this process's TrainingJob schema (with the model types and protocols its plugins registered)."""
    spec = copy.deepcopy(SWEEP_SCHEMA)
    forbid_unknown(spec)
    job = manifest_schema(strict=True)
    spec["properties"]["template"]["properties"]["spec"] = job["properties"]["spec"]
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"type": "string", "enum": [API_VERSION]},
            "kind": {"type": "string", "enum": [SWEEP_KIND]},
            "metadata": job["properties"]["metadata"],
            "spec": spec,
            "status": {"type": "object"},
        },
    }


def sweep_default(path: str) -> Any:
    """The schema's default of a sweep spec field, by its dotted path ("earlyStopping.reductionFactor")."""
    node = SWEEP_SCHEMA
    for name in path.split("."):
        node = node["properties"][name]
    return node["default"]
