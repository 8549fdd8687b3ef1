"""TrainingJob status: phase and metav1.Condition-shaped conditions (pure helpers)."""
from __future__ import annotations

import copy
import datetime
from typing import Any, Mapping

TERMINAL_PHASES = ("Succeeded", "Failed")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[Mapping[str, Any]] | None,
    type_: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
    timestamp: str | None = None,
) -> list[dict[str, Any]]:
    """A new conditions list with `type_` set; lastTransitionTime changes only when the status does."""
    result = [copy.deepcopy(dict(c)) for c in conditions or [] if c.get("type") != type_]
    previous = next((c for c in conditions or [] if c.get("type") == type_), None)
    changed = previous is None or previous.get("status") != status
    condition: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": (timestamp or now()) if changed else previous["lastTransitionTime"],
    }
    if generation is not None:
        condition["observedGeneration"] = int(generation)
    result.append(condition)
    return result


def get_condition(status: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any] | None:
    return next((c for c in (status or {}).get("conditions") or [] if c.get("type") == type_), None)


def is_invalid(status: Mapping[str, Any] | None) -> bool:
    failed = get_condition(status, "Failed")
    return bool(failed and failed.get("status") == "True" and failed.get("reason") == "InvalidSpec")
