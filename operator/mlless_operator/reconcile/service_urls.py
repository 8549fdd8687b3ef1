"""Service URLs with their passwords and CA bundles, read from Secrets: for the OpenFaaS copy
(`mlless_operator.backends.openfaas`), and to clean up an external Redis."""
from __future__ import annotations

import base64
import binascii
from typing import Any, Mapping

import kopf

from mlless.transport.credentials import with_password
from mlless.transport.tls import TrustedCA
from mlless_operator.builders.jobref import JobRef
from mlless_operator.kubeapi import KubeAPI


def secret_value(secret: Mapping[str, Any] | None, key: str) -> str | None:
    """A Secret's value for `key`, decoded; None if absent."""
    if not secret:
        return None
    data = secret.get("data") or {}
    if key in data:
        try:
            return base64.b64decode(data[key]).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
    # Servers answer with base64 `data`; a client may have stored `stringData` (an emulator keeps it as sent).
    value = (secret.get("stringData") or {}).get(key)
    return None if value is None else str(value)


async def referenced(api: KubeAPI, job: JobRef, service: str, field: str) -> str | None:
    """The value spec.<service>.<field> (a Secret key reference) points to; None without the reference."""
    ext = job.external(service)
    assert ext is not None, f"spec.{service} is managed, not external"
    ref = ext.get(field)
    if not ref:
        return None
    value = secret_value(await api.get("v1", "Secret", job.namespace, ref["name"]), ref["key"])
    if value is None:
        raise kopf.TemporaryError(f"spec.{service}.{field}: Secret {ref['name']} has no key {ref['key']} (yet)", delay=30)
    return value


async def external_url(api: KubeAPI, job: JobRef, service: str) -> str:
    """spec.<service>.url with the password from its passwordSecretRef, percent-encoded."""
    password = await referenced(api, job, service, "passwordSecretRef")  # (asserts that the service is external)
    return with_password(job.external(service)["url"], password)


async def external_ca(api: KubeAPI, job: JobRef, service: str) -> TrustedCA | None:
    """The CA bundle from spec.<service>.caSecretRef; None for the system's CAs only."""
    pem = await referenced(api, job, service, "caSecretRef")
    return None if pem is None else TrustedCA(f"spec.{service}.caSecretRef", pem=pem)
