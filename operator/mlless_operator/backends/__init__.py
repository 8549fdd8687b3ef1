"""The worker backends, one module each, and which one a job gets.

A backend (`base.Backend`) is registered by name. A job gets the one its
`mlless.io/backend` annotation names, once the operator has chosen and
recorded it, or the user has set it (so a registered backend that
spec.function.backend cannot name can still be chosen); else the one
spec.function.backend asks for, if the API server serves what it needs; else
`FALLBACK`. "auto" takes the first served backend in registration order:
knative, openfaas, then pod, which is always served, so a backend registered
later is only chosen by name (the annotation, as
tests/operator/test_custom_backend_kmock.py does).
"""
from __future__ import annotations

from mlless_operator.backends.base import Backend
from mlless_operator.backends.knative import KnativeBackend
from mlless_operator.backends.openfaas import OpenFaaSBackend
from mlless_operator.backends.pod import PodBackend
from mlless_operator.builders.jobref import JobRef, Manifest
from mlless_operator.builders.supervisor import build_supervisor_pod
from mlless_operator.kubeapi import KubeAPI

#: The backend a job falls back to when the one it asks for is not served.
FALLBACK = "pod"

_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    """Make `backend` available by its name; a name is taken once."""
    if backend.name in _REGISTRY:
        raise ValueError(f"a backend named {backend.name!r} is already registered")
    _REGISTRY[backend.name] = backend
    return backend


def known(name: str | None) -> bool:
    return name in _REGISTRY


def get(name: str) -> Backend:
    """The backend registered as `name` (KeyError if none is)."""
    return _REGISTRY[name]


async def served_backends(api: KubeAPI) -> set[str]:
    """Backends whose custom resources the API server serves (those that need none always)."""
    served = set()
    for name, backend in _REGISTRY.items():
        if backend.requires is None:
            served.add(name)
            continue
        group_version, plural = backend.requires
        status, data = await api.request("GET", f"/apis/{group_version}")
        if status == 200 and isinstance(data, dict) and any(r.get("name") == plural for r in data.get("resources") or []):
            served.add(name)
    return served


def choose_backend(requested: str | None, served: set[str], default: str = "auto") -> tuple[str, str | None]:
    """The backend to use and, if it differs from the one asked for, why."""
    wanted = requested or default
    if wanted == "auto":
        return next(name for name in _REGISTRY if name in served), None
    if wanted in served:
        return wanted, None
    backend = _REGISTRY.get(wanted)
    missing = " ".join(backend.requires) if backend is not None and backend.requires else "no backend of that name"
    return FALLBACK, f"backend {wanted} requested but {missing} is not served; using pods"


def worker_endpoint(job: JobRef) -> str:
    """Where the supervisor invokes the workers of the job's backend; empty when they are started for it."""
    return get(job.backend).endpoint(job)


def supervisor_pod(job: JobRef, restart: int = 0) -> Manifest:
    """The supervisor pod, told how to reach the workers of the job's backend (see `build_supervisor_pod`)."""
    return build_supervisor_pod(job, get(job.backend).invocation, worker_endpoint(job), restart)


for _builtin in (KnativeBackend(), OpenFaaSBackend(), PodBackend()):
    register(_builtin)
