"""A backend the operator does not ship: a `Backend` subclass registered here, chosen by the job's `mlless.io/backend`
annotation, then reconciled, scaled and cleaned up by the real operator on kmock like a built-in one."""
from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping

import kmock
import pytest

from mlless.contract import ANNOTATION_BACKEND, LABEL_JOB, WORKER_INVOCATION_EXTERNAL
from mlless_operator import backends
from mlless_operator.backends.base import Backend, PodSelector, Session
from mlless_operator.backends.pod import build_worker_pod
from mlless_operator.builders.jobref import JobRef, Manifest
from mlless_operator.kubeapi import KubeAPI

from scenario import NS, PODS, TJ, env, manifest, running_operator  # tests/operator/ is on sys.path

pytestmark = pytest.mark.asyncio

SANDBOX = "sandbox"
POLICIES = kmock.resource("networking.k8s.io/v1/networkpolicies")


class SandboxBackend(Backend):
    """Worker pods in a namespace of their own, where the job's owner references cannot reach: `cleanup` deletes them."""

    name = "sandbox"
    invocation = WORKER_INVOCATION_EXTERNAL

    def worker(self, job: JobRef, rank: int) -> Manifest:
        pod = build_worker_pod(job, rank)
        meta = pod["metadata"]
        meta.update(name=f"{job.namespace}-{meta['name']}", namespace=SANDBOX)
        del meta["ownerReferences"]
        return pod

    async def ensure_workers(self, api: KubeAPI, job: JobRef, session: Session, status: Mapping[str, Any],
                             highest_used: int) -> tuple[dict[str, str], int | None]:
        changes, _ = await self.scale(api, job, job.workers)
        return {what: verb for verb, what in (change.split(" ", 1) for change in changes)}, None

    async def scale(self, api: KubeAPI, job: JobRef, workers: int, removed: Iterable[int] = (), highest_used: int = -1,
                    missing_ok: bool = False) -> tuple[list[str], int | None]:
        have = {pod["metadata"]["name"] for pod in await api.list("v1", "Pod", SANDBOX, {LABEL_JOB: job.name})}
        want = {pod["metadata"]["name"]: pod for pod in (self.worker(job, rank) for rank in range(workers))}
        changes = [f"deleted Pod/{name}" for name in sorted(have - want.keys()) if await api.delete("v1", "Pod", SANDBOX, name)]
        changes += [f"created Pod/{name}" for name in sorted(want.keys() - have) if await api.ensure_pod(want[name]) == "created"]
        return changes, None

    async def cleanup(self, api: KubeAPI, job: JobRef, logger: logging.Logger | logging.LoggerAdapter) -> None:
        await self.scale(api, job, 0)

    def foreign_pods(self, job: JobRef) -> list[PodSelector]:
        return [(SANDBOX, {LABEL_JOB: job.name})]


backends.register(SandboxBackend())


async def test_a_registered_backend_creates_scales_and_cleans_up_its_workers(cluster_factory):
    async with cluster_factory() as c, running_operator():
        doc = manifest()
        doc["metadata"]["annotations"] = {ANNOTATION_BACKEND: "sandbox"}
        job = await c.created(doc)
        assert job["metadata"]["annotations"][ANNOTATION_BACKEND] == "sandbox"
        sandboxed = lambda: c.names(PODS, SANDBOX)  # noqa: E731
        assert sandboxed() == {"team-ml-worker-0", "team-ml-worker-1", "team-ml-worker-2"}
        assert c.names(PODS) == {"ml-supervisor"}  # no worker of the pod backend
        supervisor = env(c.get(PODS, "ml-supervisor"))
        assert supervisor["MLLESS_WORKER_BACKEND"]["value"] == "sandbox"
        assert supervisor["MLLESS_WORKER_INVOCATION"]["value"] == "external"
        peers = c.get(POLICIES, "ml-services")["spec"]["ingress"][0]["from"]
        assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": SANDBOX}},
                "podSelector": {"matchLabels": {LABEL_JOB: "ml"}}} in peers

        await c.patch_job("ml", {"spec": {"workers": 2}})
        await c.until(lambda: sandboxed() == {"team-ml-worker-0", "team-ml-worker-1"}, "the sandbox scaled to 2")

        status, _ = await c.call("DELETE", f"/apis/mlless.io/v1alpha1/namespaces/{NS}/trainingjobs/ml")
        assert status == 200
        await c.until(lambda: c.get(TJ, "ml") is None, "the job released by its finalizer")
        assert sandboxed() == set()
