"""The operator's Prometheus metrics.

Collectors are created once, when this module is first imported: Kopf
re-executes `main.py` on every run (and tests start it many times), which
would otherwise register them twice ("Duplicated timeseries").
"""
from __future__ import annotations

import functools
from typing import Any, Awaitable, Callable, TypeVar

from prometheus_client import Counter, Gauge, start_http_server

PHASES = ("Pending", "Running", "Suspended", "Succeeded", "Failed")

RECONCILES = Counter("mlless_operator_reconciles", "Handler invocations, by handler.", ["handler"])
ERRORS = Counter("mlless_operator_errors", "Handler invocations that raised, by handler.", ["handler"])
JOBS = Gauge("mlless_operator_jobs", "TrainingJobs this operator knows of, by phase.", ["phase"])

_phases: dict[str, str] = {}  # job uid -> phase

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def instrumented(handler: str) -> Callable[[F], F]:
    """Count every invocation of an async handler, and those that raised."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        async def run(*args: Any, **kwargs: Any) -> Any:
            RECONCILES.labels(handler).inc()
            try:
                return await fn(*args, **kwargs)
            except Exception:
                ERRORS.labels(handler).inc()
                raise

        return run  # type: ignore[return-value]

    return wrap


def observe_phase(uid: str, phase: str) -> None:
    _phases[uid] = phase
    _refresh()


def forget(uid: str) -> None:
    _phases.pop(uid, None)
    _refresh()


def _refresh() -> None:
    counts = {phase: 0 for phase in PHASES}
    for phase in _phases.values():
        counts[phase] = counts.get(phase, 0) + 1
    for phase, n in counts.items():
        JOBS.labels(phase).set(n)


def serve(port: int) -> None:
    if port:
        start_http_server(port)
