"""Each worker rank's own identity, as an entry of the job Secret (pod backend): made before the rank's pod, and
removed once its pod is deleted.

The issuer (`credentials.ISSUER_KEY`, which no pod mounts) certifies each new rank's identity, and the operator
patches it into the job Secret as `identity-rank-RANK` before it creates the pod, which reads that entry alone
(`backends.pod.build_worker_pod`). A rank is never reused within a session (`mlless_operator.ranks`), so within it
a retired rank's identity can only speak as a rank the job has left (a new session numbers ranks from 0 again under
the same issuer, and certificates are not revoked: docs/kubernetes.md); removing its entry when its pod goes keeps
the Secret to the ranks alive. Patching only these entries leaves the services' passwords as they were.
"""
from __future__ import annotations

from typing import Iterable

import kopf

from mlless.transport import TransportError
from mlless.protocol.identity import Issuer
from mlless.transport.credentials import read_identity
from mlless_operator.builders.credentials import ISSUER_KEY, RANK_IDENTITY_PREFIX, b64, rank_identity_key
from mlless_operator.builders.jobref import JobRef
from mlless_operator.builders.names import secret_name
from mlless_operator.kubeapi import KubeAPI
from mlless_operator.reconcile.service_urls import secret_value


async def hand_out(api: KubeAPI, job: JobRef, ranks: Iterable[int], only: bool = False) -> list[int]:
    """Make sure the job Secret holds an identity for each of `ranks`, and with `only` for no other rank (a new
    session starts from rank 0, and the pods of the last one are gone); returns the ranks given a new one."""
    secret = await api.get("v1", "Secret", job.namespace, secret_name(job))
    if secret is None:
        raise kopf.TemporaryError(f"Secret {secret_name(job)} does not exist yet", delay=5)
    data = secret.get("data") or {}
    ranks = list(ranks)
    missing = [rank for rank in ranks if rank_identity_key(rank) not in data]
    wanted = {rank_identity_key(rank) for rank in ranks}
    stale = {key: None for key in data if only and key.startswith(RANK_IDENTITY_PREFIX) and key not in wanted}
    if not missing:
        if stale:
            await api.patch("v1", "Secret", job.namespace, secret_name(job), {"data": stale})
        return []
    text = secret_value(secret, ISSUER_KEY)
    try:
        issuer = read_identity(text, f"Secret {secret_name(job)} {ISSUER_KEY}") if text else None
    except TransportError as exc:
        raise kopf.PermanentError(str(exc)) from None
    if not isinstance(issuer, Issuer):
        raise kopf.PermanentError(f"Secret {secret_name(job)} has no {ISSUER_KEY} (made by an operator before "
                                  "per-worker identities): recreate the TrainingJob")
    entries = {**stale, **{rank_identity_key(rank): b64(issuer.issue(rank).text()) for rank in missing}}
    if await api.patch("v1", "Secret", job.namespace, secret_name(job), {"data": entries}) is None:
        raise kopf.TemporaryError(f"Secret {secret_name(job)} is gone", delay=5)
    return missing


async def retire(api: KubeAPI, job: JobRef, ranks: Iterable[int]) -> None:
    """Remove the identities of `ranks`, whose pods are deleted, from the job Secret."""
    entries = {rank_identity_key(rank): None for rank in ranks}
    if entries:
        await api.patch("v1", "Secret", job.namespace, secret_name(job), {"data": entries})
