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
    {"name": "Until", "type": "string", "jsonPath": ".status.progressLimit", "priority": 1,
     "description": "The spec.stop limit Progress and ETA count towards (maxEpochs: at the latest)"},
    {"name": "ETA-Low", "type": "number", "jsonPath": ".status.etaLowSeconds", "priority": 1,
     "description": "A projected stop's ETA in its early futures"},
    {"name": "ETA-High", "type": "number", "jsonPath": ".status.etaHighSeconds", "priority": 1,
     "description": "A projected stop's ETA in its late futures"},
]


def custom_resource(names: dict[str, str], description: str, spec: dict[str, Any], status: dict[str, Any],
                    subresources: dict[str, Any], columns: list[dict[str, Any]]) -> dict[str, Any]:
    """A namespaced CRD of this group, served and stored at VERSION; `names` holds kind, plural, singular and
    shortName."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{names['plural']}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": names["kind"],
                "listKind": f"{names['kind']}List",
                "plural": names["plural"],
                "singular": names["singular"],
                "shortNames": [names["shortName"]],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": description,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": copy.deepcopy(spec),
                                "status": copy.deepcopy(status),
                            },
                        }
                    },
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def crd_manifest() -> dict[str, Any]:
    return custom_resource(
        {"kind": KIND, "plural": PLURAL, "singular": SINGULAR, "shortName": SHORT_NAME},
        "A serverless training job: one supervisor and spec.workers worker functions.",
        SPEC_SCHEMA, STATUS_SCHEMA,
        {
            "status": {},
            "scale": {
                "specReplicasPath": ".spec.workers",
                "statusReplicasPath": ".status.workers",
                "labelSelectorPath": ".status.selector",
            },
        },
        PRINTER_COLUMNS,
    )


def render_crd(manifest: dict[str, Any], schema_module: str, module: str) -> str:
    header = f"# Generated from functions/mlless/spec/{schema_module}.py by `python -m {module}`; do not edit.\n"
    return header + yaml.safe_dump(manifest, sort_keys=False, width=120)


def render() -> str:
    return render_crd(crd_manifest(), "schema", "mlless.spec.crd")


if __name__ == "__main__":
    sys.stdout.write(render())
