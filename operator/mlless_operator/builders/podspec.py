"""What every pod of a job shares: security contexts and resource requests."""
from __future__ import annotations

import copy
from typing import Any, Mapping

from mlless_operator.builders.jobref import Manifest

RUNTIME_UID = 10001  # the mlless image's user
SERVICE_UID = 999  # the redis and rabbitmq images' own non-root user


def pod_security_context(uid: int = RUNTIME_UID) -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(read_only_root: bool = True) -> Manifest:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": read_only_root,
        "capabilities": {"drop": ["ALL"]},
    }


def resources(section: Mapping[str, Any] | None, default: Manifest) -> Manifest:
    """A spec section's `resources`, else `default`."""
    res = (section or {}).get("resources")
    return copy.deepcopy(dict(res)) if res else copy.deepcopy(default)
