"""The job's Secret (generated passwords, service URLs, invocation token, the job's issuer and its processes'
identities) and the env vars that read it; and the volumes that bring an external service's CA bundle
(spec.<service>.caSecretRef) to the runtime."""
from __future__ import annotations

import base64
import secrets
from typing import Mapping

from mlless.contract import CA_FILE_VARS, ENV_AMQP_URL, ENV_REDIS_URL, joined_shard_urls
from mlless.transport.base import ANY_WORKER, SUPERVISOR
from mlless.protocol.identity import Issuer
from mlless.transport.credentials import IDENTITY_FILE, PASSWORD_VARS
from mlless_operator.builders.jobref import JobRef, Manifest
from mlless_operator.builders.names import (
    AMQP_PORT,
    REDIS_PORT,
    metadata,
    rabbitmq_name,
    redis_shards,
    secret_name,
)

RABBITMQ_USER = "mlless"

# Secret keys
REDIS_PASSWORD_KEY = "redis-password"
REDIS_URL_KEY = "redis-url"
RABBITMQ_USER_KEY = "rabbitmq-username"
RABBITMQ_PASSWORD_KEY = "rabbitmq-password"
AMQP_URL_KEY = "amqp-url"
INVOKE_TOKEN_KEY = "invoke-token"
#: The job's issuer (mlless.protocol.identity): the operator alone reads it, to certify each new rank's identity;
#: no pod mounts it.
ISSUER_KEY = "identity-issuer"
#: The supervisor's identity: only the supervisor's pod reads it.
SUPERVISOR_IDENTITY_KEY = "identity-supervisor"
#: The identity a function backend's replicas share, as any replica may be invoked as any rank (docs/kubernetes.md, "Security");
#: named as the runtime reads it from a mounted Secret (OpenFaaS), and never mounted by a pod of the pod backend.
WORKERS_IDENTITY_KEY = IDENTITY_FILE
#: Where a runtime container finds a service's CA bundle (named by `mlless.contract.CA_FILE_VARS`): one folder per
#: service, holding only the caSecretRef's key, as CA_FILE.
CA_DIR = "/etc/mlless/ca"
CA_FILE = "ca.pem"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


#: The Secret entries of worker ranks' identities (pod backend) start with this.
RANK_IDENTITY_PREFIX = "identity-rank-"


def rank_identity_key(rank: int) -> str:
    """The Secret entry of worker `rank`'s identity (pod backend): only that rank's pod reads it."""
    return f"{RANK_IDENTITY_PREFIX}{rank}"


def generate_credentials(job: JobRef) -> dict[str, str]:
    """Fresh passwords (URL-safe, so they can sit in a URL unescaped) for the managed services, the token the
    supervisor invokes worker functions with (a Knative or OpenFaaS URL is reachable from the whole cluster), and
    the job's issuer with the identities it certified, which its processes seal every frame with (anyone who
    reaches Redis must not be able to feed them one, and no worker can pass for another rank or the supervisor).
    Each rank's own is added when its pod is made (`mlless_operator.reconcile.identities`)."""
    issuer = Issuer()
    creds: dict[str, str] = {INVOKE_TOKEN_KEY: secrets.token_urlsafe(32), ISSUER_KEY: issuer.text(),
                             SUPERVISOR_IDENTITY_KEY: issuer.issue(SUPERVISOR).text(),
                             WORKERS_IDENTITY_KEY: issuer.issue(ANY_WORKER).text()}
    if job.external("redis") is None:
        pw = secrets.token_urlsafe(24)
        creds[REDIS_PASSWORD_KEY] = pw
        creds[REDIS_URL_KEY] = joined_shard_urls([f"redis://:{pw}@{name}.{job.namespace}.svc:{REDIS_PORT}/0"
                                                  for name, _ in redis_shards(job)])
    if job.external("rabbitmq") is None:
        pw = secrets.token_urlsafe(24)
        creds[RABBITMQ_USER_KEY] = RABBITMQ_USER
        creds[RABBITMQ_PASSWORD_KEY] = pw
        creds[AMQP_URL_KEY] = f"amqp://{RABBITMQ_USER}:{pw}@{rabbitmq_name(job)}.{job.namespace}.svc:{AMQP_PORT}/%2F"
    return creds


def build_secret(job: JobRef, credentials: Mapping[str, str] | None = None) -> Manifest:
    """The job's Secret. Create it once; only its rank identities are patched in and out
    (`mlless_operator.reconcile.identities`): its passwords must stay what the services started with."""
    creds = generate_credentials(job) if credentials is None else credentials
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(job, secret_name(job), "credentials"),
        "type": "Opaque",
        "data": {k: b64(v) for k, v in sorted(creds.items())},
    }


def secret_env(name: str, secret: str, key: str) -> Manifest:
    """Env var `name` from key `key` of Secret `secret`."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def service_env(job: JobRef) -> list[Manifest]:
    """REDIS_URL and AMQP_URL for a runtime container: from the job Secret, or the external URL + its password Secret
    (and where its CA bundle is mounted, see ca_volumes)."""
    env: list[Manifest] = []
    for service, url_var, pw_var, url_key in (
        ("redis", ENV_REDIS_URL, PASSWORD_VARS[ENV_REDIS_URL], REDIS_URL_KEY),
        ("rabbitmq", ENV_AMQP_URL, PASSWORD_VARS[ENV_AMQP_URL], AMQP_URL_KEY),
    ):
        ext = job.external(service)
        if ext is None:
            env.append(secret_env(url_var, secret_name(job), url_key))
        else:
            env.append({"name": url_var, "value": ext["url"]})
            if ext.get("passwordSecretRef"):
                # The runtime percent-encodes it into the URL (mlless.transport.credentials); `$(VAR)` would paste it raw.
                ref = ext["passwordSecretRef"]
                env.append(secret_env(pw_var, ref["name"], ref["key"]))
    env += [{"name": CA_FILE_VARS[service], "value": f"{CA_DIR}/{service}/{CA_FILE}"} for service, _ in ca_refs(job)]
    return env


def ca_refs(job: JobRef) -> list[tuple[str, Mapping[str, str]]]:
    """(service, caSecretRef) of each external service whose CA bundle is given."""
    return [(service, ext["caSecretRef"]) for service in CA_FILE_VARS
            if (ext := job.external(service)) is not None and ext.get("caSecretRef")]


def ca_volumes(job: JobRef) -> list[Manifest]:
    """A Secret volume per external service with a caSecretRef, holding that one key as CA_FILE."""
    return [{"name": f"{service}-ca", "secret": {"secretName": ref["name"], "items": [{"key": ref["key"], "path": CA_FILE}]}}
            for service, ref in ca_refs(job)]


def ca_mounts(job: JobRef) -> list[Manifest]:
    """Where ca_volumes go in a runtime container, read-only."""
    return [{"name": f"{service}-ca", "mountPath": f"{CA_DIR}/{service}", "readOnly": True} for service, _ in ca_refs(job)]
