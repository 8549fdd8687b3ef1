"""docs/sweep-reference.md: every TrainingSweep field, generated from the sweep's schema (`mlless.spec.sweep`).

    python -m mlless.spec.sweep_reference > docs/sweep-reference.md
"""
from __future__ import annotations

import copy
import sys

from mlless.contract import API_VERSION, SWEEP_KIND
from mlless.spec.reference import table
from mlless.spec.sweep import SWEEP_SCHEMA, SWEEP_STATUS_SCHEMA

HEADER = ("<!-- Generated from functions/mlless/spec/sweep.py by "
          "`python -m mlless.spec.sweep_reference > docs/sweep-reference.md`; do not edit. -->\n")


def render() -> str:
    spec = copy.deepcopy(SWEEP_SCHEMA)
    # The template's spec is a TrainingJob's, whose fields docs/reference.md lists.
    spec["properties"]["template"]["properties"]["spec"] = {
        "type": "object", "description": "A TrainingJob spec: every field of [the TrainingJob reference](reference.md)."}
    lines = [
        HEADER,
        "# TrainingSweep reference",
        "",
        f"A `{SWEEP_KIND}` (`apiVersion: {API_VERSION}`) runs trials of one TrainingJob template over a search "
        "space: `mlless sweep` on a laptop, `kubectl apply` on a cluster ([sweeps](sweeps.md)). Its schema is "
        "functions/mlless/spec/sweep.py; the CRD (crds/trainingsweep.yaml) and this page are generated from it.",
        "",
        "## Spec",
        "",
        *table(spec, "spec"),
        "",
        "## Status",
        "",
        SWEEP_STATUS_SCHEMA["description"],
        "",
        *table(SWEEP_STATUS_SCHEMA, "status"),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
