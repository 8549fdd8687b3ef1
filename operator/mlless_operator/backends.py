"""Which worker backends the cluster serves, found through API discovery."""
from __future__ import annotations

import logging

from mlless_operator.kubeapi import KubeAPI

log = logging.getLogger("mlless_operator")

#: backend -> (group/version, plural) of the CRD it needs; `pod` needs nothing.
REQUIRED = {
    "knative": ("serving.knative.dev/v1", "services"),
    "openfaas": ("openfaas.com/v1", "functions"),
}
PREFERENCE = ("knative", "openfaas", "pod")


async def served_backends(api: KubeAPI) -> set[str]:
    """Backends whose custom resources the API server serves (pod always)."""
    served = {"pod"}
    for backend, (group_version, plural) in REQUIRED.items():
        status, data = await api.request("GET", f"/apis/{group_version}")
        if status == 200 and isinstance(data, dict):
            if any(r.get("name") == plural for r in data.get("resources") or []):
                served.add(backend)
    return served


def choose_backend(requested: str | None, served: set[str], default: str = "auto") -> tuple[str, str | None]:
    """The backend to use and, if it differs from the one asked for, why."""
    wanted = requested or default
    if wanted == "auto":
        return next(b for b in PREFERENCE if b in served), None
    if wanted in served:
        return wanted, None
    return "pod", f"backend {wanted} requested but {REQUIRED[wanted][0]} {REQUIRED[wanted][1]} is not served; using pods"
