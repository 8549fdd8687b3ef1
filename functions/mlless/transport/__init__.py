"""Transports: how a job's supervisor and workers exchange bytes and control frames.

``connect()`` picks the backend: the embedded broker when an address is given
(laptop runs), otherwise Redis + RabbitMQ (cluster runs).  With no argument at
all it reads the embedded address, or the Redis and AMQP URLs, from the
environment (`mlless.contract`'s ENV_* names), which is how the operator hands
per-job credentials to pods without them ever appearing in a command line.
The process's identity (see ``mlless.transport.base``) comes the same way
unless given; there is no transport without one.
"""
from __future__ import annotations

import os
from typing import Any

from mlless.contract import ENV_AMQP_URL, ENV_EMBEDDED_ADDRESS, ENV_IDENTITY, ENV_REDIS_URL, ENV_SECRETS_DIR

from .base import (
    DEFAULT_TTL,
    SUPERVISOR,
    Role,
    Transport,
    TransportError,
    UnroutableError,
    redact_url,
)
from mlless.protocol.identity import Identity, Issuer

from .credentials import IDENTITY_FILE, identity as env_identity

__all__ = [
    "DEFAULT_TTL",
    "SUPERVISOR",
    "Role",
    "Transport",
    "TransportError",
    "UnroutableError",
    "EmbeddedBroker",
    "EmbeddedTransport",
    "ServicesTransport",
    "connect",
    "redact_url",
]


def connect(
    job_id: str,
    *,
    redis_url: str | None = None,
    amqp_url: str | None = None,
    embedded_address: str | None = None,
    role: Role,
    rank: int | None = None,
    identity: Identity | Issuer | None = None,
    **options: Any,
) -> Transport:
    """Open this process's transport for ``job_id``, sealing with ``identity`` (default: the environment's).

    Returns only once the process's own queue exists (for a worker: declared
    and bound to the job's fanout), so every later broadcast reaches it.
    ``options`` go to the backend constructor (e.g. ``ttl=`` seconds).
    """
    if identity is None:
        identity = env_identity(os.environ)
    if identity is None:
        raise TransportError(f"no identity: set {ENV_IDENTITY}, or the file {IDENTITY_FILE} under {ENV_SECRETS_DIR} "
                             "(`mlless train` and the operator make one per process)")
    if embedded_address is None and redis_url is None and amqp_url is None:
        embedded_address = os.environ.get(ENV_EMBEDDED_ADDRESS) or None
        if embedded_address is None:
            redis_url = os.environ.get(ENV_REDIS_URL) or None
            amqp_url = os.environ.get(ENV_AMQP_URL) or None
    if embedded_address is not None:
        if redis_url is not None or amqp_url is not None:
            raise ValueError("give either embedded_address or redis_url+amqp_url, not both")
        from .embedded import EmbeddedTransport

        return EmbeddedTransport(embedded_address, job_id, role=role, rank=rank, identity=identity, **options)
    if redis_url is None or amqp_url is None:
        raise ValueError(
            f"no transport configured: pass embedded_address, or both redis_url and amqp_url "
            f"(or set {ENV_EMBEDDED_ADDRESS}, or {ENV_REDIS_URL} and {ENV_AMQP_URL})"
        )
    from .services import ServicesTransport

    return ServicesTransport(job_id, redis_url=redis_url, amqp_url=amqp_url, role=role, rank=rank, identity=identity, **options)


def __getattr__(name: str) -> Any:
    """Lazy backend imports: a laptop run never needs to import redis or pika."""
    if name == "EmbeddedBroker":
        from .embedded_broker import EmbeddedBroker

        return EmbeddedBroker
    if name == "EmbeddedTransport":
        from .embedded import EmbeddedTransport

        return EmbeddedTransport
    if name == "ServicesTransport":
        from .services import ServicesTransport

        return ServicesTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
