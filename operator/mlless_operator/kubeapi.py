"""Conflict-tolerant writes to the Kubernetes API (the operator's `call_kubeapi`).

One generic REST path for every kind, built-in or custom, through the
`kubernetes` client's authenticated `ApiClient` (in-cluster service account or
kubeconfig), run in a thread so Kopf's event loop never blocks. `ensure` is the
idempotent get-then-create-or-patch every reconcile uses: a 409 on create means
someone (an earlier run of this handler) got there first, and is not an error.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any, Mapping

import kopf
import kubernetes.client
import kubernetes.config

from mlless.contract import API_VERSION, KIND, PLURAL, SWEEP_KIND, SWEEP_PLURAL

log = logging.getLogger("mlless_operator")

Manifest = dict[str, Any]

#: (apiVersion, kind) -> plural, for every kind the operator writes.
PLURALS: dict[tuple[str, str], str] = {
    ("v1", "Secret"): "secrets",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Service"): "services",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "Pod"): "pods",
    ("apps/v1", "StatefulSet"): "statefulsets",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("serving.knative.dev/v1", "Service"): "services",
    ("openfaas.com/v1", "Function"): "functions",
    (API_VERSION, KIND): PLURAL,
    (API_VERSION, SWEEP_KIND): SWEEP_PLURAL,
}

_ENSURED = frozenset({"create", "get", "patch"})  # ensure(): get, then create or patch
#: Every verb this client may use, per kind: the contract with the chart's ClusterRole (tests/test_chart.py
#: requires it to grant exactly these, plus what Kopf itself needs). `KubeAPI` refuses anything else, so a
#: code path that needs a new verb fails in the tests, not with a 403 in a cluster.
VERBS: dict[tuple[str, str], frozenset[str]] = {
    # The job Secret (create-only), the OpenFaaS copy (ensured, deleted on cleanup), passwordSecretRef reads.
    ("v1", "Secret"): _ENSURED | {"delete"},
    ("v1", "ConfigMap"): _ENSURED,
    ("v1", "Service"): _ENSURED,
    ("v1", "ServiceAccount"): _ENSURED,
    # Created once (a Pod's spec is immutable); listed by scale-in and the PodsHealthy check; deleted by scale-in,
    # suspension, the deadline and a supervisor's restart.
    ("v1", "Pod"): frozenset({"create", "get", "list", "delete"}),
    ("apps/v1", "StatefulSet"): _ENSURED,
    ("networking.k8s.io/v1", "NetworkPolicy"): _ENSURED,
    ("rbac.authorization.k8s.io/v1", "Role"): _ENSURED,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): _ENSURED,
    ("serving.knative.dev/v1", "Service"): _ENSURED,
    # In the OpenFaaS namespace, out of reach of owner references: deleted by the cleanup handler.
    ("openfaas.com/v1", "Function"): _ENSURED | {"delete"},
    # ttlSecondsAfterFinished; a sweep's trials are created, read, listed (its cleanup) and deleted (ASHA's losers).
    # Kopf itself watches and patches TrainingJobs.
    (API_VERSION, KIND): frozenset({"create", "get", "list", "delete"}),
    # Kopf watches and patches TrainingSweeps; the sweep handler reads each afresh and writes its status.
    (API_VERSION, SWEEP_KIND): frozenset({"get", "patch"}),
}


class KubeAPIError(kopf.TemporaryError):
    """A transient API failure (5xx, 429, connection): Kopf retries the handler."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API {status}: {message}", delay=5)
        self.status = status


class KubeAPIRejected(kopf.PermanentError):
    """The API rejected what we sent (4xx other than 404/409/429): retrying would not help."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API {status}: {message}")
        self.status = status


def check_verb(api_version: str, kind: str, verb: str) -> None:
    """Refuse a verb `VERBS` does not declare for the kind (the chart's ClusterRole would not grant it)."""
    if verb not in VERBS.get((api_version, kind), ()):
        raise KubeAPIRejected(403, f"{verb} {api_version} {kind} is not declared in mlless_operator.kubeapi.VERBS (nor granted by the chart)")


def resource_path(api_version: str, kind: str, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
    plural = PLURALS[(api_version, kind)]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


def make_client() -> kubernetes.client.ApiClient:
    """An ApiClient for the in-cluster service account, else $KUBECONFIG / ~/.kube/config (read now, not at import)."""
    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
    return kubernetes.client.ApiClient(configuration)


def is_subset(desired: Any, actual: Any) -> bool:
    """Whether `actual` already has every field of `desired` (the server may add defaults around them)."""
    if isinstance(desired, Mapping):
        return isinstance(actual, Mapping) and all(k in actual and is_subset(v, actual[k]) for k, v in desired.items())
    if isinstance(desired, list):
        return isinstance(actual, list) and len(desired) == len(actual) and all(is_subset(d, a) for d, a in zip(desired, actual))
    return desired == actual


#: Top-level fields `ensure` keeps in sync on an existing object (metadata is merged separately).
_SYNCED_FIELDS = ("spec", "data", "rules", "roleRef", "subjects")


class KubeAPI:
    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self.client = client

    def close(self) -> None:
        self.client.close()

    # ---- raw requests ---------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json", query: list | None = None) -> tuple[int, Any]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        params = self.client.param_serialize(
            method, path, query_params=query or [], header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        response = self.client.call_api(*params)
        response.read()
        raw = response.data or b""
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = raw.decode(errors="replace")
        return response.status, data

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json", query: list | None = None) -> tuple[int, Any]:
        try:
            return await asyncio.to_thread(self._call, method, path, body, content_type, query)
        except kubernetes.client.exceptions.ApiException as exc:  # connection-level failures
            raise KubeAPIError(exc.status or 0, str(exc.reason)) from None
        except OSError as exc:
            raise KubeAPIError(0, str(exc)) from None

    @staticmethod
    def _raise(status: int, data: Any, what: str) -> None:
        message = data.get("message", "") if isinstance(data, Mapping) else str(data)[:300]
        message = f"{what}: {message}"
        if status >= 500 or status in (0, 429):
            raise KubeAPIError(status, message)
        raise KubeAPIRejected(status, message)

    # ---- verbs ----------------------------------------------------------------------------------

    async def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Manifest | None:
        check_verb(api_version, kind, "get")
        status, data = await self.request("GET", resource_path(api_version, kind, namespace, name))
        if status == 404:
            return None
        if status != 200:
            self._raise(status, data, f"get {kind} {namespace}/{name}")
        return data

    async def list(self, api_version: str, kind: str, namespace: str | None, labels: Mapping[str, str] | None = None) -> list[Manifest]:
        """Objects of a kind; the label selector is also applied here, client-side, in case the server ignores it."""
        check_verb(api_version, kind, "list")
        query = [("labelSelector", ",".join(f"{k}={v}" for k, v in labels.items()))] if labels else []
        status, data = await self.request("GET", resource_path(api_version, kind, namespace), query=query)
        if status == 404:
            return []
        if status != 200:
            self._raise(status, data, f"list {kind} in {namespace}")
        items = (data or {}).get("items") or []
        if labels:
            items = [o for o in items if all((o.get("metadata", {}).get("labels") or {}).get(k) == v for k, v in labels.items())]
        return items

    async def create(self, obj: Manifest) -> Manifest | None:
        """Create; None if it already exists (409)."""
        meta = obj["metadata"]
        check_verb(obj["apiVersion"], obj["kind"], "create")
        status, data = await self.request("POST", resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace")), obj)
        if status == 409:
            return None
        if status not in (200, 201, 202):
            self._raise(status, data, f"create {obj['kind']} {meta.get('namespace')}/{meta['name']}")
        return data

    async def patch(self, api_version: str, kind: str, namespace: str | None, name: str, body: Manifest, subresource: str | None = None) -> Manifest | None:
        """JSON merge-patch; None if the object is gone (404)."""
        check_verb(api_version, kind, "patch")
        path = resource_path(api_version, kind, namespace, name, subresource)
        status, data = await self.request("PATCH", path, body, "application/merge-patch+json")
        if status == 404:
            return None
        if status != 200:
            self._raise(status, data, f"patch {kind} {namespace}/{name}")
        return data

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str, uid: str | None = None) -> bool:
        """Delete (background propagation); False if it was already gone or its kind is not served.

        With `uid`, only that incarnation of the object: a precondition the API server checks, answering
        409 (also False here) when the name now belongs to a newer object, e.g. a re-created pod.
        """
        check_verb(api_version, kind, "delete")
        body: Manifest = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        status, data = await self.request("DELETE", resource_path(api_version, kind, namespace, name), body)
        if status == 404 or (status == 409 and uid):
            return False
        if status not in (200, 202):
            self._raise(status, data, f"delete {kind} {namespace}/{name}")
        return True

    async def ensure(self, obj: Manifest, update: bool = True) -> str:
        """Make `obj` exist: 'created', 'patched' (its synced fields differed) or 'unchanged'.

        With `update=False` an existing object is left alone (Secrets whose
        passwords services already use, Pods whose specs are immutable). An
        existing object owned by something else is never adopted or changed.
        """
        meta = obj["metadata"]
        api_version, kind, namespace, name = obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"]
        if update:  # whether or not this call needs a patch: the verb must be there when one does
            check_verb(api_version, kind, "patch")
        for _ in range(3):
            current = await self.get(api_version, kind, namespace, name)
            if current is None:
                if await self.create(obj) is not None:
                    return "created"
                continue  # 409: created concurrently (or by an earlier, interrupted run); look again
            _check_owner(obj, current)
            if not update:
                return "unchanged"
            changes: Manifest = {k: obj[k] for k in _SYNCED_FIELDS if k in obj and not is_subset(obj[k], current.get(k))}
            for field in ("labels", "annotations"):
                if meta.get(field) and not is_subset(meta[field], current.get("metadata", {}).get(field)):
                    changes.setdefault("metadata", {})[field] = meta[field]
            if not changes:
                return "unchanged"
            if await self.patch(api_version, kind, namespace, name, changes) is not None:
                return "patched"
        raise KubeAPIError(409, f"{kind} {namespace}/{name} keeps appearing and disappearing")

    async def ensure_pod(self, pod: Manifest) -> str:
        """Create a pod unless it exists. One still terminating must go first: a Pod's spec is immutable, and a new
        supervisor or worker must not be mistaken for the old one that is on its way out (after a suspension)."""
        meta = pod["metadata"]
        current = await self.get("v1", "Pod", meta["namespace"], meta["name"])
        if current is not None and current["metadata"].get("deletionTimestamp"):
            raise kopf.TemporaryError(f"Pod {meta['name']} is still terminating; waiting to create its successor", delay=5)
        return await self.ensure(pod, update=False)


def _check_owner(desired: Manifest, current: Manifest) -> None:
    want = {r.get("uid") for r in desired["metadata"].get("ownerReferences") or []}
    have = {r.get("uid") for r in current.get("metadata", {}).get("ownerReferences") or []}
    if want and not want & have:
        meta = current["metadata"]
        # Likely the children of a deleted job of the same name, not yet garbage-collected: try again later.
        raise kopf.TemporaryError(f"{current.get('kind')} {meta.get('namespace')}/{meta.get('name')} exists and is not ours", delay=10)
