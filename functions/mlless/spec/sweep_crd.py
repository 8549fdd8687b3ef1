"""The TrainingSweep CustomResourceDefinition, generated from the sweep's schema (`mlless.spec.sweep`).

    python -m mlless.spec.sweep_crd > crds/trainingsweep.yaml

A test fails if the committed file and the schema drift apart, as for the TrainingJob's (`mlless.spec.crd`).
"""
from __future__ import annotations

import sys
from typing import Any

from mlless.contract import SWEEP_KIND, SWEEP_PLURAL, SWEEP_SHORT_NAME, SWEEP_SINGULAR
from mlless.spec.crd import custom_resource, render_crd
from mlless.spec.sweep import SWEEP_SCHEMA, SWEEP_STATUS_SCHEMA

PRINTER_COLUMNS = [
    {"name": "State", "type": "string", "jsonPath": ".status.phase", "description": "Lifecycle phase"},
    {"name": "Trials", "type": "integer", "jsonPath": ".status.trialsCreated", "description": "Trials started"},
    {"name": "Running", "type": "integer", "jsonPath": ".status.trialsRunning", "description": "Trials running now"},
    {"name": "Best", "type": "number", "jsonPath": ".status.bestValidationLoss",
     "description": "Lowest validation loss of a trial"},
    {"name": "Cost", "type": "number", "jsonPath": ".status.costUSD", "description": "The trials' cost so far, USD"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Best-Trial", "type": "string", "jsonPath": ".status.bestTrial", "priority": 1,
     "description": "The trial with the lowest validation loss"},
]


def crd_manifest() -> dict[str, Any]:
    return custom_resource(
        {"kind": SWEEP_KIND, "plural": SWEEP_PLURAL, "singular": SWEEP_SINGULAR, "shortName": SWEEP_SHORT_NAME},
        "A hyperparameter sweep: trial TrainingJobs of one template over a search space, losers stopped early.",
        SWEEP_SCHEMA, SWEEP_STATUS_SCHEMA, {"status": {}}, PRINTER_COLUMNS,
    )


def render() -> str:
    return render_crd(crd_manifest(), "sweep", "mlless.spec.sweep_crd")


if __name__ == "__main__":
    sys.stdout.write(render())
