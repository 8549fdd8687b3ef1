"""The worker backends, one module each, and which one a job gets.

A backend (`base.Backend`) is registered by name (`BACKENDS`, a `mlless.spec.registry.Registry`, which admits the
name to spec.function.backend in the operator's validation; the CRD lists the built-in ones). A job gets the one
its `mlless.io/backend` annotation names, once the operator has chosen and recorded it, or the user has set it;
else the one spec.function.backend asks for, if the API server serves what it needs; else `FALLBACK`. "auto"
takes the first served backend in registration order: knative, openfaas, then pod, which is always served, so a
backend registered later is only chosen by name (as tests/operator/test_custom_backend_kmock.py does).
"""
from __future__ import annotations

from mlless.spec.registry import Registry
from mlless_operator.backends.base import Backend
from mlless_operator.backends.knative import KnativeBackend
from mlless_operator.backends.openfaas import OpenFaaSBackend
from mlless_operator.backends.pod import PodBackend
from mlless_operator.builders.jobref import JobRef, Manifest
from mlless_operator.builders.supervisor import build_supervisor_pod
from mlless_operator.kubeapi import KubeAPI

#: The backend a job falls back to when the one it asks for is not served.
FALLBACK = "pod"

#: Every backend by the name spec.function.backend gives it, in registration order ("auto" takes the first served).
BACKENDS: Registry[Backend] = Registry("function backend", "function.backend")
register = BACKENDS.register


def known(name: str | None) -> bool:
    return name in BACKENDS


def get(name: str) -> Backend:
    """The backend registered as `name` (ValueError if none is)."""
    return BACKENDS.named(name)


async def served_backends(api: KubeAPI) -> set[str]:
    """Backends whose custom resources the API server serves (those that need none always)."""
    served = set()
    for name in BACKENDS:
        backend = BACKENDS.named(name)
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
        return next(name for name in BACKENDS if name in served), None
    if wanted in served:
        return wanted, None
    backend = BACKENDS.named(wanted) if wanted in BACKENDS else None
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
