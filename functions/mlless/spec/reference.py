"""docs/reference.md: every TrainingJob field with its type, default and meaning, generated from the schema.

    python -m mlless.spec.reference > docs/reference.md

A test fails if the committed file and the schema drift apart, as for the CRD (`mlless.spec.crd`).
"""
from __future__ import annotations

import sys
from typing import Any

from mlless.contract import API_VERSION, KIND
from mlless.spec.nodes import Schema, default_sentence, shown
from mlless.spec.schema import CLUSTER_SPEC, SPEC_SCHEMA, STATUS_SCHEMA, walk

HEADER = ("<!-- Generated from functions/mlless/spec/schema.py by "
          "`python -m mlless.spec.reference > docs/reference.md`; do not edit. -->\n")


def _bounds(node: Schema) -> list[str]:
    """A number's bounds as `≥ 1`, `> 0`, `< 1` (OpenAPI 3.0's boolean exclusive bounds)."""
    bounds = []
    if "minimum" in node:
        bounds.append(f"{'>' if node.get('exclusiveMinimum') else '≥'} {shown(node['minimum'])}")
    if "maximum" in node:
        bounds.append(f"{'<' if node.get('exclusiveMaximum') else '≤'} {shown(node['maximum'])}")
    return bounds


def _type_of(node: Schema) -> str:
    """A field's type with its constraints: `integer, ≥ 1, ≤ 1024`, `string: pmf, logistic-regression`."""
    if node.get("type") == "array":
        return f"array of {_type_of(node['items'])}"
    parts = [node.get("type", "any"), *_bounds(node)]
    if "format" in node:
        parts.append(node["format"])
    if node.get("minLength"):
        parts.append("not empty")
    described = ", ".join(parts)
    if "enum" in node:
        described += ": " + ", ".join(f"`{value}`" for value in node["enum"])
    return described


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(schema: Schema, root: str, only: set[str] | None = None) -> list[str]:
    """One row per field below `schema` (at path `root`); `only`: just these top-level fields and what they hold."""
    required = {f"{path}.{name}" for path, node in walk(schema, root) for name in node.get("required", ())}
    rows = ["| Field | Type | Default | Meaning |", "| --- | --- | --- | --- |"]
    for path, node in walk(schema, root):
        top = path.removeprefix(f"{root}.").split(".")[0]
        if path == root or path.endswith("[]") or (only is not None and top not in only):
            continue
        description = node["description"]
        if "default" in node:
            description = description.removesuffix(default_sentence(node["default"]))
            default = f"`{shown(node['default'])}`"
        else:
            default = "required" if path in required else ""
        rows.append(f"| `{path}` | {_cell(_type_of(node))} | {default} | {_cell(description)} |")
    return rows


def render() -> str:
    training = set(SPEC_SCHEMA["properties"]) - set(CLUSTER_SPEC)
    lines = [
        HEADER,
        "# TrainingJob reference",
        "",
        f"A `{KIND}` (`apiVersion: {API_VERSION}`) is one manifest for both `mlless train` on a laptop and "
        "`kubectl apply` on a cluster. Its schema is functions/mlless/spec/schema.py; the CRD "
        "(crds/trainingjob.yaml) is generated from it, and so is this page.",
        "",
        "## Training",
        "",
        _cell(SPEC_SCHEMA["description"]),
        "",
        *table(SPEC_SCHEMA, "spec", training),
        "",
        "## Cluster",
        "",
        "Read by the operator only: a local `mlless train` accepts and ignores them, so one manifest serves both.",
        "",
        *table(SPEC_SCHEMA, "spec", set(CLUSTER_SPEC)),
        "",
        "## Status",
        "",
        _cell(STATUS_SCHEMA["description"]),
        "",
        *table(STATUS_SCHEMA, "status"),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
