"""The TrainingJob CustomResourceDefinition, generated from the schema the CLI validates with.

`crds/trainingjob.yaml` (and the Helm chart's copy) is this module's output:
    python -m mlless.spec.crd > crds/trainingjob.yaml
A test fails if the committed file and the schema drift apart.
"""
from __future__ import annotations

import copy
import sys
from typing import Any

import yaml

from mlless.contract import GROUP, KIND, PLURAL, SHORT_NAME, SINGULAR, VERSION
from mlless.spec.schema import SPEC_SCHEMA, STATUS_SCHEMA

PRINTER_COLUMNS = [
    {"name": "State", "type": "string", "jsonPath": ".status.phase", "description": "Lifecycle phase"},
    {"name": "Workers", "type": "integer", "jsonPath": ".status.workers", "description": "Workers in the job now"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.step", "description": "Last closed step"},
    {"name": "Progress", "type": "number", "jsonPath": ".status.progress",
     "description": "Fraction done of the nearest stop limit"},
    {"name": "ETA", "type": "number", "jsonPath": ".status.etaSeconds", "description": "Seconds until the job ends"},
    {"name": "Loss", "type": "number", "jsonPath": ".status.trainLoss", "description": "Training loss (RMSE or BCE)"},
    {"name": "Cost", "type": "number", "jsonPath": ".status.costUSD", "description": "Serverless cost so far, USD"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    # Shown by `kubectl get tj -o wide` only: most jobs never restart their supervisor.
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.supervisorRestarts", "priority": 1,
     "description": "Times the supervisor pod was recreated (spec.backoffLimit)"},
    {"name": "Projected", "type": "number", "jsonPath": ".status.projectedCostUSD", "priority": 1,
     "description": "Projected cost at the job's end, USD"},
]


def crd_manifest() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": [SHORT_NAME],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A serverless training job: one supervisor and spec.workers worker functions.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": copy.deepcopy(SPEC_SCHEMA),
                                "status": copy.deepcopy(STATUS_SCHEMA),
                            },
                        }
                    },
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.workers",
                            "statusReplicasPath": ".status.workers",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def render() -> str:
    header = "# Generated from functions/mlless/spec/schema.py by `python -m mlless.spec.crd`; do not edit.\n"
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False, width=120)


if __name__ == "__main__":
    sys.stdout.write(render())
