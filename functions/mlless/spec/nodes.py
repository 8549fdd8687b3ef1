"""Builders of the TrainingJob schema's OpenAPI nodes (`mlless.spec.schema`): typed fields that record their default
in the schema, the one place it is written, and say it in their description."""
from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def shown(value: Any) -> str:
    """A value as the descriptions (and docs/reference.md) write it: true, 0.9, 1e-08, isp."""
    return str(value).lower() if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) else str(value)


def default_sentence(default: Any) -> str:
    """What a field's description ends with when the field has a default."""
    return f" Default {shown(default)}."


def with_default(node: Schema, default: Any) -> Schema:
    """Record a field's default in the schema, the one place it is written, and say it in the description."""
    if default is not None:
        node["default"] = default
        node["description"] += default_sentence(default)
    return node


def number(description: str, minimum: float | None = None, exclusive: bool = False, below: float | None = None,
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
    return with_default(node, default)


#: The largest value of an integer field without a tighter bound: Kubernetes' int32 (a maxSteps of 1e26 used to be
#: accepted, and overflowed what was computed from it).
MAX_INT = 2**31 - 1


def integer(description: str, minimum: int | None = None, maximum: int = MAX_INT,
            default: int | None = None) -> Schema:
    node: Schema = {"type": "integer", "description": description, "maximum": maximum}
    if minimum is not None:
        node["minimum"] = minimum
    return with_default(node, default)


def boolean(description: str, default: bool) -> Schema:
    return with_default({"type": "boolean", "description": description}, default)


def choice(description: str, values: list[str], default: str | None = None) -> Schema:
    return with_default({"type": "string", "enum": values, "description": description}, default)


def obj(description: str, properties: dict[str, Schema], required: list[str] | None = None) -> Schema:
    node: Schema = {"type": "object", "description": description, "properties": properties}
    if required:
        node["required"] = required
    return node


def integers(description: str, minimum: int, maximum: int = MAX_INT, default: list[int] | None = None) -> Schema:
    """A list of integers, each within [minimum, maximum]."""
    node: Schema = {"type": "array", "description": description,
                    "items": {"type": "integer", "minimum": minimum, "maximum": maximum}}
    return with_default(node, default)


def string(description: str, enum: list[str] | None = None, fmt: str | None = None) -> Schema:
    node: Schema = {"type": "string", "description": description}
    if enum:
        node["enum"] = enum
    if fmt:
        node["format"] = fmt
    return node
