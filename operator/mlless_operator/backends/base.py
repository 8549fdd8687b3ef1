"""`Backend`: everything the operator knows about one way of running a job's workers.

Reconciliation, scaling, suspension, the PodsHealthy check, the NetworkPolicy
and cleanup ask the job's backend (`mlless_operator.backends.get`) instead of
branching on its name, so a new backend is one module that subclasses this and
registers an instance.
"""
from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Iterable, Literal, Mapping

import kopf

from mlless_operator.builders.jobref import JobRef, Manifest
from mlless_operator.kubeapi import KubeAPI

#: How a session's workers come: `start`, ranks 0..N-1 of a new session; `continue`, the operator restarted mid-session.
Session = Literal["start", "continue"]
#: A set of pods: (namespace, labels they all carry).
PodSelector = tuple[str, Mapping[str, str]]


class Backend(ABC):
    #: What spec.function.backend, or the job's `mlless.io/backend` annotation, calls it.
    name: ClassVar[str]
    #: How the supervisor reaches the workers: mlless.contract.WORKER_INVOCATION_HTTP or WORKER_INVOCATION_EXTERNAL.
    invocation: ClassVar[str]
    #: (group/version, plural) of the custom resource the API server must serve for it; None: always available.
    requires: ClassVar[tuple[str, str] | None] = None

    def endpoint(self, job: JobRef) -> str:
        """Where the supervisor invokes the workers; empty when they are started for it."""
        return ""

    @abstractmethod
    async def ensure_workers(self, api: KubeAPI, job: JobRef, session: Session, status: Mapping[str, Any],
                             highest_used: int) -> tuple[dict[str, str], int | None]:
        """Make the workers exist: ('Kind/name' -> created, patched, unchanged, deleted), and the highest rank now
        used if the backend has rank pods (else None); `status` and `highest_used` steer a `continue`d session."""

    @abstractmethod
    async def scale(self, api: KubeAPI, job: JobRef, workers: int, removed: Iterable[int] = (), highest_used: int = -1,
                    missing_ok: bool = False) -> tuple[list[str], int | None]:
        """Bring the workers to `workers` replicas (0 stops them all); returns what changed and, for rank pods, the
        highest rank now used. `missing_ok`: workers that are not there are already stopped; otherwise retry later."""

    async def cleanup(self, api: KubeAPI, job: JobRef, logger: logging.Logger | logging.LoggerAdapter) -> None:
        """On deletion: remove the children owner references cannot reach (those outside the job's namespace)."""

    def foreign_pods(self, job: JobRef) -> list[PodSelector]:
        """The worker pods outside the job's namespace: PodsHealthy watches them, the NetworkPolicy lets them in."""
        return []


async def ensure_all(api: KubeAPI, *objs: Manifest) -> dict[str, str]:
    """Ensure each object in turn: 'Kind/name' -> created, patched or unchanged."""
    return {f"{obj['kind']}/{obj['metadata']['name']}": await api.ensure(obj) for obj in objs}


async def patch_scale(api: KubeAPI, api_version: str, kind: str, namespace: str, name: str, body: Manifest, workers: int,
                      missing_ok: bool) -> list[str]:
    """Merge-patch `body` into the one object that holds a backend's replica count."""
    if await api.patch(api_version, kind, namespace, name, body) is None:
        if missing_ok:
            return []
        raise kopf.TemporaryError(f"the {kind} {namespace}/{name} is not there (yet)", delay=10)
    return [f"patched {kind}/{name} scale to {workers}"]
