"""TrainingJob status: phase and metav1.Condition-shaped conditions, and their timestamps (pure helpers)."""
from __future__ import annotations

import copy
import datetime
from typing import Any, Mapping

from mlless.contract import TERMINAL_JOB_PHASES

#: Pod phases after which a pod never runs again (the runtime's pods never restart once finished).
FINISHED_POD_PHASES = ("Succeeded", "Failed")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime.datetime | None:
    """An RFC 3339 timestamp as written by `now()` or the API server; None if absent or unreadable."""
    if not text:
        return None
    try:
        value = datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=datetime.timezone.utc)


def seconds_since(text: str | None, at: datetime.datetime | None = None) -> float | None:
    """Seconds from the timestamp `text` to `at` (default: now); None if `text` is absent or unreadable."""
    then = parse_time(text)
    if then is None:
        return None
    return ((at or datetime.datetime.now(datetime.timezone.utc)) - then).total_seconds()


def finished_at(status: Mapping[str, Any] | None) -> str | None:
    """When a Succeeded or Failed job ended: completionTime, else the transition time of its terminal condition."""
    status = status or {}
    if status.get("phase") not in TERMINAL_JOB_PHASES:
        return None
    if status.get("completionTime"):
        return str(status["completionTime"])
    condition = get_condition(status, status["phase"])
    return condition.get("lastTransitionTime") if condition else None


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


def is_true(status: Mapping[str, Any] | None, type_: str) -> bool:
    condition = get_condition(status, type_)
    return bool(condition and condition.get("status") == "True")


def supervisor_restarts(status: Mapping[str, Any] | None) -> int:
    """status.supervisorRestarts: how many times the supervisor pod has been recreated (0 if never)."""
    return int((status or {}).get("supervisorRestarts") or 0)


def is_invalid(status: Mapping[str, Any] | None) -> bool:
    failed = get_condition(status, "Failed")
    return bool(failed and failed.get("status") == "True" and failed.get("reason") == "InvalidSpec")
