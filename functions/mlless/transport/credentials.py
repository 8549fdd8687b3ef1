"""Redis and RabbitMQ URLs, and the worker invocation token, from a process's environment, as the operator hands them over.

- `REDIS_URL` / `AMQP_URL`, complete (the job's generated Secret holds whole URLs); a sharded Redis's URLs
  are separated by spaces, one per shard;
- or, for an external service, the URL without its password plus `REDIS_PASSWORD` /
  `RABBITMQ_PASSWORD` from the user's Secret; the password is percent-encoded here,
  because the kubelet's `$(VAR)` expansion would paste `@`, `/` or `:` in raw and
  break the URL;
- or, on OpenFaaS (which has no secretKeyRef), files `redis-url` / `amqp-url` under
  `MLLESS_SECRETS_DIR`.

The invocation token (`MLLESS_INVOKE_TOKEN`, or the file `invoke-token`) is the
job's shared secret between the supervisor and its worker functions, whose URL
any pod in the cluster can reach.

A process's identity (`MLLESS_IDENTITY`, or the file `identity`) is what it
seals every frame with (`mlless.protocol.identity`, `mlless.protocol.sealing`):
its own signing key, certified by the job's issuer. Whoever starts a job's
processes holds the issuer (`mlless train` in its own process, the operator in
the job's Secret) and hands each process its own identity in its environment,
never on a command line. No secret is ever logged.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping
from urllib.parse import quote, urlsplit, urlunsplit

from mlless.contract import (
    ENV_AMQP_URL,
    ENV_INVOKE_TOKEN,
    ENV_IDENTITY,
    ENV_RABBITMQ_PASSWORD,
    ENV_REDIS_PASSWORD,
    ENV_REDIS_URL,
    ENV_SECRETS_DIR,
    joined_shard_urls,
    shard_urls,
)
from mlless.protocol.identity import Identity, Issuer, parse_identity
from mlless.transport.base import TransportError

PASSWORD_VARS = {ENV_REDIS_URL: ENV_REDIS_PASSWORD, ENV_AMQP_URL: ENV_RABBITMQ_PASSWORD}
SECRET_FILES = {ENV_REDIS_URL: "redis-url", ENV_AMQP_URL: "amqp-url"}


def with_password(url: str, password: str | None) -> str:
    """`url` with `password` (percent-encoded) as its password; unchanged if `password` is None. A sharded Redis's
    URLs (`shard_urls`) each get it: an external sharded Redis has one passwordSecretRef."""
    if password is None:
        return url
    return joined_shard_urls([_with_password(u, password) for u in shard_urls(url)])


def _with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:{quote(password, safe='')}@{host}"))


def service_urls(environ: Mapping[str, str]) -> dict[str, str]:
    """Whichever of REDIS_URL and AMQP_URL the environment provides (none, one or both)."""
    urls = {name: environ[name] for name in SECRET_FILES if environ.get(name)}
    secrets_dir = environ.get(ENV_SECRETS_DIR)
    for name, filename in SECRET_FILES.items():
        if name not in urls and secrets_dir:
            path = Path(secrets_dir) / filename
            try:
                urls[name] = path.read_text().strip()
            except OSError as exc:
                raise TransportError(f"{path}: cannot read the {name} secret: {exc.strerror}") from None
    for name, password_var in PASSWORD_VARS.items():
        if name in urls and environ.get(password_var) is not None:
            urls[name] = with_password(urls[name], environ[password_var])
    return urls


def _secret(environ: Mapping[str, str], name: str, filename: str) -> tuple[str, str] | None:
    """(secret, where it came from) from the variable `name`, or else the file `filename` under MLLESS_SECRETS_DIR;
    None if neither has it."""
    if environ.get(name):
        return environ[name], name
    secrets_dir = environ.get(ENV_SECRETS_DIR)
    path = Path(secrets_dir) / filename if secrets_dir else None
    if path is not None and path.exists():
        text = path.read_text().strip()
        return (text, str(path)) if text else None
    return None


def invoke_token(environ: Mapping[str, str]) -> str | None:
    """The job's invocation token, or None when the operator gave none."""
    found = _secret(environ, ENV_INVOKE_TOKEN, "invoke-token")
    return None if found is None else found[0]


#: The identity's file under MLLESS_SECRETS_DIR (OpenFaaS mounts each key of a Secret as a file of its name).
IDENTITY_FILE = "identity"


def read_identity(text: str, where: str = ENV_IDENTITY) -> Identity | Issuer:
    """The identity (or issuer) of its text form; TransportError naming `where` (never the text) if it is not one."""
    try:
        return parse_identity(text)
    except ValueError as exc:
        raise TransportError(f"{where}: {exc}") from None


def identity(environ: Mapping[str, str]) -> Identity | Issuer | None:
    """This process's identity from the environment (or the file `identity` under MLLESS_SECRETS_DIR); None if
    neither has one."""
    found = _secret(environ, ENV_IDENTITY, IDENTITY_FILE)
    return None if found is None else read_identity(*found)
